//! A message written as one line of JSON without long CPU work on an async worker: a
//! message of up to [`JSON_ON_WORKER`] bytes is serialized where it is sent (about a
//! millisecond at most), a longer one (a passed result, a resource page: up to tens of MiB)
//! on a blocking thread. Its size is learnt by serializing it into a buffer that refuses
//! to grow past the bound, so nothing is measured twice but that first MiB.

use std::io;

use serde::Serialize;

/// The most bytes of JSON parsed or serialized on an async worker: 1 MiB, about a
/// millisecond. Past it, psych-mcp's transports and the gateway's stdio transport parse a
/// line or body, and serialize a message, on a blocking thread.
pub const JSON_ON_WORKER: usize = 1024 * 1024;

/// A message as a line (its JSON and `\n`), or the message back when its JSON is longer
/// than [`JSON_ON_WORKER`] (then [`line_off_worker`] makes it).
///
/// # Errors
///
/// The message cannot be serialized (a map with keys that are not strings, say).
pub fn line_on_worker<T: Serialize>(message: T) -> Result<Result<Vec<u8>, T>, io::Error> {
    let mut capped = Capped(Vec::new());
    match serde_json::to_writer(&mut capped, &message) {
        Ok(()) => {
            let mut line = capped.0;
            line.push(b'\n');
            Ok(Ok(line))
        }
        Err(error) if error.is_io() => Ok(Err(message)),
        Err(error) => Err(io::Error::other(error)),
    }
}

/// A message as a line, serialized on a blocking thread.
///
/// # Errors
///
/// The message cannot be serialized, or the thread's task failed (a panic, the runtime
/// ending).
pub async fn line_off_worker<T: Serialize + Send + 'static>(message: T) -> io::Result<Vec<u8>> {
    tokio::task::spawn_blocking(move || {
        let mut line = serde_json::to_vec(&message).map_err(io::Error::other)?;
        line.push(b'\n');
        Ok(line)
    })
    .await
    .map_err(io::Error::other)?
}

/// Runs `parse` of `bytes` bytes of an answer where its size says: inline up to
/// [`JSON_ON_WORKER`], on a blocking thread past it (the remote transports' bodies and
/// events; a stdio line keeps its parse's handle across dropped receives instead). `Err`
/// only when that thread's task failed (a panic, the runtime's end).
pub(crate) async fn parse_by_size<T: Send + 'static>(
    bytes: usize,
    parse: impl FnOnce() -> T + Send + 'static,
) -> Result<T, tokio::task::JoinError> {
    if bytes > JSON_ON_WORKER {
        tokio::task::spawn_blocking(parse).await
    } else {
        Ok(parse())
    }
}

/// A buffer that refuses to hold more than [`JSON_ON_WORKER`] bytes.
struct Capped(Vec<u8>);

impl io::Write for Capped {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        if self.0.len() + bytes.len() > JSON_ON_WORKER {
            return Err(io::Error::other(
                "over the bound of serializing on a worker",
            ));
        }
        self.0.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(
        clippy::unwrap_used,
        clippy::expect_used,
        reason = "a test fails loudly on bad data"
    )]

    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;

    #[tokio::test]
    async fn a_long_message_is_given_back_and_made_off_the_worker() {
        let short = json!({"text": "a".repeat(JSON_ON_WORKER - 20)});
        let made = line_on_worker(&short).unwrap().unwrap();
        assert_eq!(made.len(), JSON_ON_WORKER - 20 + 12);
        assert_eq!(made.last(), Some(&b'\n'));
        let long = json!({"text": "a".repeat(JSON_ON_WORKER)});
        let given_back = line_on_worker(long.clone()).unwrap().unwrap_err();
        assert_eq!(given_back, long);
        let made = line_off_worker(long.clone()).await.unwrap();
        let mut want = serde_json::to_vec(&long).unwrap();
        want.push(b'\n');
        assert_eq!(made, want);
        // Not serializable at all: an error, whatever its size.
        let bad: BTreeMap<(u8, u8), u8> = [((1, 2), 3)].into();
        assert!(line_on_worker(&bad).is_err());
        assert!(line_off_worker(bad).await.is_err());
    }
}
