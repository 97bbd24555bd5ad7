//! Text too large to hold in memory: a tool result's text block kept in a file from the
//! moment it is read off the wire until the record log has stored it.
//!
//! A transport that meets an answer larger than it will hold in memory (psych-mcp's stdio
//! and HTTP transports, past their in-memory caps) decodes each large text block's text
//! into an unnamed file and hands the result on as a [`ToolOutput`](crate::ToolOutput)
//! whose [`spilled`](crate::ToolOutput::spilled) list names those blocks. The record log
//! stores the file's bytes as the block's text, streamed, so the log holds the result whole
//! and everything after it (previews, `read_tool_output`) reads it from the log.

use std::fmt;
use std::fs::File;
use std::io;
use std::sync::Arc;

/// The text of one content block, in a file rather than in memory.
///
/// The file holds exactly [`len`](Self::len) bytes of valid UTF-8 from offset 0; whoever
/// builds one guarantees it (psych-mcp decodes the JSON string into it, replacing what is
/// not valid UTF-8 by U+FFFD). The file is usually unnamed (unlinked right after it was
/// created), so it goes when the last handle to it does, and a process killed on the way
/// leaves nothing behind.
///
/// Reads ([`read_at`](Self::read_at)) are positional file reads: they block, so from async
/// code call them from `spawn_blocking`.
pub struct SpilledText {
    file: File,
    len: u64,
    /// Kept with the text, dropped with it (see [`SpilledText::holding`]).
    _hold: Option<Box<dyn std::any::Any + Send + Sync>>,
}

impl SpilledText {
    /// The text in `file`: its first `len` bytes, valid UTF-8.
    pub fn new(file: File, len: u64) -> Self {
        Self {
            file,
            len,
            _hold: None,
        }
    }

    /// The same text, keeping `hold` until the text is dropped: what must live exactly as
    /// long as the file does (psych-mcp's share of its disk budget, given back when the
    /// last holder of the text lets it go). Replaces what it held before.
    #[must_use]
    pub fn holding(mut self, hold: impl std::any::Any + Send + Sync) -> Self {
        self._hold = Some(Box::new(hold));
        self
    }

    /// The text's length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the text is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Reads bytes of the text from `offset` into `buf`; returns how many (0 at or past the
    /// end). Blocks (a positional file read).
    ///
    /// # Errors
    ///
    /// The file's read error.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        if offset >= self.len {
            return Ok(0);
        }
        let room = usize::try_from(self.len - offset).unwrap_or(usize::MAX);
        let want = buf.len().min(room);
        read_at(&self.file, &mut buf[..want], offset)
    }

    /// The text whole, read into memory. Blocks; for tests and small texts only: the point
    /// of a spilled text is that it is not held in memory.
    ///
    /// # Errors
    ///
    /// The file's read error, or `InvalidData` if the bytes are not UTF-8.
    pub fn read_to_string(&self) -> io::Result<String> {
        let len = usize::try_from(self.len)
            .map_err(|_| io::Error::new(io::ErrorKind::OutOfMemory, "text too long"))?;
        let mut bytes = vec![0; len];
        let mut done = 0;
        while done < len {
            let n = self.read_at(done as u64, &mut bytes[done..])?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the spill file is shorter than its text",
                ));
            }
            done += n;
        }
        String::from_utf8(bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }

    /// The one line that stands in memory for the text (in the block's `text`): what a
    /// reader of the in-memory output sees, saying where the text is.
    pub fn placeholder(&self) -> String {
        format!(
            "[{} bytes of text, too large to hold in memory: the record log stores it whole]",
            self.len
        )
    }
}

impl fmt::Debug for SpilledText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SpilledText")
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

#[cfg(unix)]
fn read_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    std::os::unix::fs::FileExt::read_at(file, buf, offset)
}

#[cfg(windows)]
fn read_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    std::os::windows::fs::FileExt::seek_read(file, buf, offset)
}

/// One text block of a [`ToolOutput`](crate::ToolOutput) whose text is spilled: block
/// number [`block`](Self::block) of its `content` is a text block whose `text` holds
/// [`SpilledText::placeholder`], and [`text`](Self::text) holds the real text.
///
/// Two are equal when they name the same block and the same file (not by comparing the
/// files' bytes).
#[derive(Debug, Clone)]
pub struct SpilledBlock {
    /// The block's position in the output's `content`.
    pub block: usize,
    /// Its text.
    pub text: Arc<SpilledText>,
}

impl PartialEq for SpilledBlock {
    fn eq(&self, other: &Self) -> bool {
        self.block == other.block && Arc::ptr_eq(&self.text, &other.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    fn spilled(text: &str) -> SpilledText {
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(text.as_bytes()).unwrap();
        file.write_all(b"trailing bytes past the text").unwrap();
        SpilledText::new(file, text.len() as u64)
    }

    #[test]
    fn reads_stop_at_the_texts_end() {
        let text = spilled("hello, world");
        let mut buf = [0u8; 64];
        assert_eq!(text.read_at(7, &mut buf).unwrap(), 5);
        assert_eq!(&buf[..5], b"world");
        assert_eq!(text.read_at(12, &mut buf).unwrap(), 0);
        assert_eq!(text.read_to_string().unwrap(), "hello, world");
        assert!(text.placeholder().starts_with("[12 bytes of text"));
    }

    #[test]
    fn what_a_text_holds_goes_when_its_last_holder_drops_it() {
        let held = Arc::new(());
        let text = Arc::new(spilled("kept").holding(Arc::clone(&held)));
        let block = SpilledBlock {
            block: 0,
            text: Arc::clone(&text),
        };
        drop(text);
        assert_eq!(
            Arc::strong_count(&held),
            2,
            "the block still holds the text"
        );
        assert_eq!(block.text.read_to_string().unwrap(), "kept");
        drop(block);
        assert_eq!(Arc::strong_count(&held), 1);
    }
}
