//! Store URLs as messages, logs and metrics may show them: without their
//! password.

/// `url` with its password, if any, replaced by `***`: what messages,
/// logs and metrics may show. Covers the password of the authority
/// (`redis://user:pass@host`, `redis://:pass@host`) and the `pass` or
/// `password` query parameter (`redis+unix:///path?pass=…`).
pub fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return redacted_query(url);
    };
    // All before the last '@' is user information, '/', '?' and '@' in
    // an unescaped password included, unless a query comes first (an
    // '@' inside `?pass=…`).
    match rest.rsplit_once('@') {
        Some((userinfo, host)) if !userinfo.contains('?') || userinfo.contains(':') => {
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{scheme}://{user}:***@{}", redacted_query(host)),
                None => format!("{scheme}://{userinfo}@{}", redacted_query(host)),
            }
        }
        _ => format!("{scheme}://{}", redacted_query(rest)),
    }
}

/// `text` with the values of its `pass` and `password` query parameters
/// replaced by `***`.
fn redacted_query(text: &str) -> String {
    let Some((head, query)) = text.split_once('?') else {
        return text.to_owned();
    };
    let params: Vec<String> = query
        .split('&')
        .map(|p| match p.split_once('=') {
            Some((k, _)) if k == "pass" || k == "password" => format!("{k}=***"),
            _ => p.to_owned(),
        })
        .collect();
    format!("{head}?{}", params.join("&"))
}

#[cfg(test)]
mod tests {
    use super::redacted;

    #[test]
    fn redacted_hides_every_password() {
        assert_eq!(
            redacted("redis://charon:s3cr%40t@10.0.0.1:6380/2"),
            "redis://charon:***@10.0.0.1:6380/2"
        );
        assert_eq!(redacted("rediss://:pw@h:1"), "rediss://:***@h:1");
        // A password may hold '@' and ':' unescaped: all before the last
        // '@' is user information.
        assert_eq!(redacted("redis://u:a@b:c@h"), "redis://u:***@h");
        assert_eq!(redacted("redis://user@h:1"), "redis://user@h:1");
        assert_eq!(redacted("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert_eq!(
            redacted("redis+unix:///run/redis.sock?db=1&pass=pw"),
            "redis+unix:///run/redis.sock?db=1&pass=***"
        );
        assert_eq!(
            redacted("redis+unix:///s?pass=a@b:c&db=1"),
            "redis+unix:///s?pass=***&db=1"
        );
        assert_eq!(redacted("redis://u:p/w?x@h/0"), "redis://u:***@h/0");
        assert_eq!(redacted("no url at all"), "no url at all");
        // A cluster's seed list: one user information for every node.
        assert_eq!(
            redacted("redis+cluster://charon:pw@10.0.0.1:7000,10.0.0.2:7001"),
            "redis+cluster://charon:***@10.0.0.1:7000,10.0.0.2:7001"
        );
        assert_eq!(
            redacted("rediss+cluster://:p@w@h1:1,h2:2/?protocol=resp3"),
            "rediss+cluster://:***@h1:1,h2:2/?protocol=resp3"
        );
    }
}
