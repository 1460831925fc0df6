//! When the server's certificate may be used. A certificate that has
//! expired, or is not valid yet, is refused at start (the server does not
//! start) and on reload (the previous one stays in force): served, it
//! would make every client that verifies certificates fail its handshake,
//! fleet-wide. The expiry of the chain in force is exported
//! (`charon_tls_certificate_expiry_seconds`) and named by `/readyz` in its
//! last day, so that it cannot lapse unnoticed.

use std::time::{Duration, UNIX_EPOCH};

use rustls::pki_types::{CertificateDer, UnixTime};

/// What `/readyz` warns about: a certificate that expires within this
/// long (and the alert rule, two weeks ahead, did not get it renewed).
pub const EXPIRY_WARNING: Duration = Duration::from_secs(24 * 3600);

/// When a chain may be used: from the latest `notBefore` to the earliest
/// `notAfter` of its certificates, in Unix seconds, and which certificate
/// ends it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Validity {
    /// The latest `notBefore` of the chain.
    pub not_before: i64,
    /// The earliest `notAfter` of the chain.
    pub not_after: i64,
    /// The subject of the certificate whose `notAfter` that is.
    pub expiring_subject: String,
}

/// The validity of `chain` (read from `file`, named in errors).
pub fn of_chain(chain: &[CertificateDer<'_>], file: &str) -> Result<Validity, String> {
    let mut validity: Option<Validity> = None;
    for (i, der) in chain.iter().enumerate() {
        let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref()).map_err(|e| {
            format!(
                "{file}: certificate {} of {}: not X.509: {e}",
                i + 1,
                chain.len()
            )
        })?;
        let v = cert.validity();
        let (from, until) = (v.not_before.timestamp(), v.not_after.timestamp());
        let subject = cert.subject().to_string();
        validity = Some(match validity {
            None => Validity {
                not_before: from,
                not_after: until,
                expiring_subject: subject,
            },
            Some(mut so_far) => {
                so_far.not_before = so_far.not_before.max(from);
                if until < so_far.not_after {
                    so_far.not_after = until;
                    so_far.expiring_subject = subject;
                }
                so_far
            }
        });
    }
    validity.ok_or_else(|| format!("{file}: no certificate in it"))
}

/// Unix seconds now, on the wall clock a client verifies certificates
/// by.
pub fn now() -> i64 {
    i64::try_from(UnixTime::now().as_secs()).unwrap_or(i64::MAX)
}

/// A date for a message: `2026-11-28T02:08:40Z`.
pub fn date(unix: i64) -> String {
    let at = UNIX_EPOCH + Duration::from_secs(u64::try_from(unix.max(0)).unwrap_or(0));
    humantime::format_rfc3339_seconds(at).to_string()
}

/// A length of time for a message, to the minute: `3h 12m`.
pub fn span(secs: i64) -> String {
    let minutes = u64::try_from(secs.max(0) / 60).unwrap_or(0);
    humantime::format_duration(Duration::from_secs(minutes * 60)).to_string()
}

/// Refuses a chain that `now` is outside of, saying which certificate,
/// since and until when, and what to do.
pub fn check(v: &Validity, now: i64, file: &str) -> Result<(), String> {
    if now < v.not_before {
        return Err(format!(
            "{file}: the certificate is not valid yet: valid from {} ({} from now); check the \
             certificate, or this host's clock",
            date(v.not_before),
            span(v.not_before - now)
        ));
    }
    if now >= v.not_after {
        return Err(format!(
            "{file}: the certificate {} expired at {} ({} ago); give the server a renewed \
             certificate",
            v.expiring_subject,
            date(v.not_after),
            span(now - v.not_after)
        ));
    }
    Ok(())
}

/// What `/readyz` says of a chain in its last [`EXPIRY_WARNING`] (or
/// expired while served), if it is.
pub fn warning(v: &Validity, now: i64, file: &str) -> Option<String> {
    let left = v.not_after - now;
    let warn = i64::try_from(EXPIRY_WARNING.as_secs()).unwrap_or(i64::MAX);
    if left >= warn {
        return None;
    }
    Some(if left <= 0 {
        format!(
            "the certificate {} ({file}) expired at {} ({} ago): clients that verify it fail; \
             renew it (the server takes the new files on SIGHUP or when they change)",
            v.expiring_subject,
            date(v.not_after),
            span(-left)
        )
    } else {
        format!(
            "the certificate {} ({file}) expires at {}, in {}: renew it (the server takes the \
             new files on SIGHUP or when they change)",
            v.expiring_subject,
            date(v.not_after),
            span(left)
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn validity(from: i64, until: i64) -> Validity {
        Validity {
            not_before: from,
            not_after: until,
            expiring_subject: "CN=x".to_owned(),
        }
    }

    #[test]
    fn outside_its_period_a_certificate_is_refused_saying_when() {
        let v = validity(1_000_000, 2_000_000);
        assert!(check(&v, 1_500_000, "s.pem").is_ok());
        let early = check(&v, 1_000_000 - 3_600, "s.pem").expect_err("early");
        assert!(
            early.contains("not valid yet") && early.contains("1h"),
            "{early}"
        );
        let late = check(&v, 2_000_000 + 86_400, "s.pem").expect_err("late");
        assert!(
            late.contains("CN=x expired at 1970-01-24T03:33:20Z (1day ago)"),
            "{late}"
        );
        assert!(check(&v, 2_000_000, "s.pem").is_err(), "notAfter is out");
    }

    #[test]
    fn the_last_day_is_named() {
        let v = validity(0, 100_000);
        assert_eq!(warning(&v, 100_000 - 86_400, "s.pem"), None);
        let soon = warning(&v, 100_000 - 3 * 3600 - 60, "s.pem").expect("soon");
        assert!(soon.contains("in 3h 1m"), "{soon}");
        let gone = warning(&v, 100_060, "s.pem").expect("gone");
        assert!(
            gone.contains("expired") && gone.contains("1m ago"),
            "{gone}"
        );
    }
}
