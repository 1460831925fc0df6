//! The pseudo-atomic multi-resource request of paper §3.3: the same number
//! of copies of several resources, or none at all.

use std::time::{Duration, Instant};

use crate::grant::RateGrant;
use crate::{Client, Error, Hold};

/// A request for copies of several resources: see [`Client::multi`].
#[derive(Debug)]
#[must_use = "a request does nothing until it is sent"]
pub struct MultiCall {
    client: Client,
    domain: String,
    copy: Vec<String>,
    rate: Option<String>,
    min: u64,
    max: u64,
    max_wait: Duration,
}

/// The result: `copies` of each resource, or 0 and nothing held.
#[derive(Debug)]
pub struct MultiGrant {
    /// Copies of every resource now held (hits granted, for the rate one).
    pub copies: u64,
    /// One hold per copy-limited resource, in the order they were given.
    pub holds: Vec<Hold>,
    /// The rate-limited resource's grant, if there was one.
    pub rate: Option<RateGrant>,
}

impl MultiCall {
    pub(crate) fn new(client: Client, domain: String) -> Self {
        Self {
            client,
            domain,
            copy: Vec::new(),
            rate: None,
            min: 1,
            max: 1,
            max_wait: Duration::ZERO,
        }
    }

    /// Adds a copy-limited resource.
    pub fn copy(mut self, resource: impl Into<String>) -> Self {
        self.copy.push(resource.into());
        self
    }

    /// Sets the one rate-limited resource. It is requested last: hits
    /// cannot be given back, so it must come after every copy is held.
    pub fn rate(mut self, resource: impl Into<String>) -> Self {
        self.rate = Some(resource.into());
        self
    }

    /// At least `min` and at most `max` copies of each resource.
    pub fn copies(mut self, min: u64, max: u64) -> Self {
        self.min = min;
        self.max = max;
        self
    }

    /// The whole request waits at most this long.
    pub fn max_wait(mut self, d: Duration) -> Self {
        self.max_wait = d;
        self
    }

    /// Reserves each copy resource in turn with as many copies as the one
    /// before granted, giving back extras as counts shrink, then requests
    /// the rate resource; any rejection gives everything back.
    pub async fn send(self) -> Result<MultiGrant, Error> {
        let started = Instant::now();
        let left = |max_wait: Duration| max_wait.saturating_sub(started.elapsed());
        let mut n = self.max;
        let mut holds: Vec<Hold> = Vec::with_capacity(self.copy.len());
        let failed = |holds: Vec<Hold>| {
            drop(holds); // releases
            Ok(MultiGrant {
                copies: 0,
                holds: Vec::new(),
                rate: None,
            })
        };
        for resource in &self.copy {
            let hold = self
                .client
                .reserve(resource.clone(), self.domain.clone())
                .copies(n)
                .min_copies(self.min)
                .max_wait(left(self.max_wait))
                .send()
                .await?;
            if !hold.is_granted() {
                return failed(holds);
            }
            shrink(&mut holds, hold.copies()).await?;
            n = hold.copies();
            holds.push(hold);
        }
        let mut rate = None;
        if let Some(resource) = &self.rate {
            let grant = self
                .client
                .request(resource.clone(), self.domain.clone())
                .copies(n)
                .min_copies(self.min)
                .max_wait(left(self.max_wait))
                .send()
                .await?;
            if !grant.is_granted() {
                return failed(holds);
            }
            shrink(&mut holds, grant.granted).await?;
            n = grant.granted;
            rate = Some(grant);
        }
        Ok(MultiGrant {
            copies: n,
            holds,
            rate,
        })
    }
}

/// Releases copies so that every hold keeps exactly `n`.
async fn shrink(holds: &mut [Hold], n: u64) -> Result<(), Error> {
    for h in holds {
        let extra = h.copies().saturating_sub(n);
        h.release(extra).await?;
    }
    Ok(())
}
