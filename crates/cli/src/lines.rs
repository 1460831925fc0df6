//! Reading input lines with a bound on their length, so that a line of
//! gigabytes (or a stream without newlines) costs a client error, not the
//! process's memory.

use std::io::{self, BufRead};

/// One line of input.
pub enum Line {
    /// The line's bytes, without the newline.
    Text,
    /// The line was longer than the bound; its bytes were skipped.
    TooLong,
}

/// Reads the next line into `buf` (cleared first). `None` at end of input.
pub fn read_bounded(
    input: &mut impl BufRead,
    buf: &mut Vec<u8>,
    max: usize,
) -> io::Result<Option<Line>> {
    buf.clear();
    let mut too_long = false;
    let mut any = false;
    loop {
        let chunk = input.fill_buf()?;
        if chunk.is_empty() {
            return Ok(any.then_some(if too_long { Line::TooLong } else { Line::Text }));
        }
        any = true;
        let (part, done) = match chunk.iter().position(|&b| b == b'\n') {
            Some(i) => (&chunk[..i], Some(i + 1)),
            None => (chunk, None),
        };
        if !too_long {
            if buf.len() + part.len() > max {
                too_long = true;
                buf.clear();
            } else {
                buf.extend_from_slice(part);
            }
        }
        let used = done.unwrap_or(chunk.len());
        input.consume(used);
        if done.is_some() {
            return Ok(Some(if too_long { Line::TooLong } else { Line::Text }));
        }
    }
}
