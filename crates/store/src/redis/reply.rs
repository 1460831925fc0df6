//! Reading script replies: arrays of status strings and integers.

use redis::Value;

use crate::StoreError;

/// A script's reply, read front to back.
#[derive(Debug)]
pub(crate) struct Reply {
    script: &'static str,
    items: std::vec::IntoIter<Value>,
}

impl Reply {
    pub(crate) fn new(script: &'static str, value: Value) -> Result<Self, StoreError> {
        match value {
            Value::Array(items) => Ok(Self {
                script,
                items: items.into_iter(),
            }),
            other => Err(bad(script, &format!("expected an array, got {other:?}"))),
        }
    }

    fn next(&mut self) -> Result<Value, StoreError> {
        self.items
            .next()
            .ok_or_else(|| bad(self.script, "the reply is too short"))
    }

    /// Whether the next item is the text `status`; if so, it is read.
    pub(crate) fn status_is(&mut self, status: &str) -> bool {
        let is = match self.items.as_slice().first() {
            Some(Value::BulkString(b)) => b.as_slice() == status.as_bytes(),
            Some(Value::SimpleString(s)) => s == status,
            _ => false,
        };
        if is {
            self.items.next();
        }
        is
    }

    /// The next item as text.
    pub(crate) fn text(&mut self) -> Result<String, StoreError> {
        match self.next()? {
            Value::BulkString(b) => {
                String::from_utf8(b).map_err(|_| bad(self.script, "text is not UTF-8"))
            }
            Value::SimpleString(s) => Ok(s),
            other => Err(bad(self.script, &format!("expected text, got {other:?}"))),
        }
    }

    /// The next item as a count (a non-negative integer).
    pub(crate) fn count(&mut self) -> Result<u64, StoreError> {
        let v = self.int()?;
        u64::try_from(v).map_err(|_| bad(self.script, &format!("negative count {v}")))
    }

    /// The next item as a flag (0 or 1).
    pub(crate) fn flag(&mut self) -> Result<bool, StoreError> {
        match self.int()? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(bad(self.script, &format!("expected 0 or 1, got {v}"))),
        }
    }

    pub(crate) fn int(&mut self) -> Result<i64, StoreError> {
        match self.next()? {
            Value::Int(v) => Ok(v),
            // HGETALL and friends give numbers as text.
            Value::BulkString(b) => std::str::from_utf8(&b)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| bad(self.script, "expected an integer")),
            other => Err(bad(
                self.script,
                &format!("expected an integer, got {other:?}"),
            )),
        }
    }

    /// The next item as a nested reply.
    pub(crate) fn nested(&mut self) -> Result<Reply, StoreError> {
        let v = self.next()?;
        Reply::new(self.script, v)
    }

    /// Items not read yet.
    pub(crate) fn remaining(&self) -> usize {
        self.items.len()
    }
}

pub(crate) fn bad(script: &str, what: &str) -> StoreError {
    StoreError::BadData(format!("unexpected reply from script {script}: {what}"))
}
