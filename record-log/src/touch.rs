//! Check on first touch: the frames an open took from the checkpoint (`docs/format.md`,
//! "Open checkpoint") had their body checksums checked by an earlier open, not by this
//! process. The first content read of such a frame in this process checksums its whole
//! body (streamed, in bounded memory) and remembers it as verified, so every byte of a
//! result's content a read serves was checksummed at open, at append, or here; a mismatch
//! is [`ReadError::Corrupt`] on that read and on every later one.

use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::crc32c::Crc32c;
use crate::format::{FRAME_HEADER_LEN, FRAME_TRAILER_LEN};
use crate::log::Entry;
use crate::{ReadError, RecordCorruption, RecordLog};

/// Bytes read at a time when a frame is verified on first touch.
const CHUNK: usize = 1 << 20;

/// Which of the frames taken from the checkpoint (the first ones of the index) this
/// process has verified.
#[derive(Debug, Default)]
pub(crate) struct FirstTouch {
    verified: Box<[AtomicBool]>,
}

impl FirstTouch {
    /// The first `frames` of the index came from the checkpoint, none verified yet.
    pub(crate) fn covering(frames: usize) -> Self {
        Self {
            verified: (0..frames).map(|_| AtomicBool::new(false)).collect(),
        }
    }

    /// Whether record `seq` came from the checkpoint and is not verified yet.
    fn pending(&self, seq: u64) -> bool {
        usize::try_from(seq)
            .ok()
            .and_then(|i| self.verified.get(i))
            .is_some_and(|verified| !verified.load(Ordering::Acquire))
    }

    /// Remembers record `seq` as verified (its body checksum checked by this process).
    pub(crate) fn verified(&self, seq: u64) {
        if let Some(verified) = usize::try_from(seq).ok().and_then(|i| self.verified.get(i)) {
            verified.store(true, Ordering::Release);
        }
    }
}

impl RecordLog {
    /// Before a read of the content of the frame at `entry`: when it came from the
    /// checkpoint and this process has not checked it, checksums its whole body.
    ///
    /// # Errors
    ///
    /// [`ReadError::Corrupt`] when the body checksum does not hold, [`ReadError::Io`] when
    /// the frame cannot be read.
    pub(crate) fn check_first_touch(&self, entry: &Entry) -> Result<(), ReadError> {
        let seq = entry.header.seq;
        if !self.first_touch.pending(seq) {
            return Ok(());
        }
        let body = FRAME_HEADER_LEN as u64;
        let trailer = entry.header.frame_len() - FRAME_TRAILER_LEN as u64;
        let mut buf = vec![0u8; CHUNK.min(usize::try_from(trailer - body).unwrap_or(CHUNK))];
        let mut crc = Crc32c::new();
        let mut at = body;
        while at < trailer {
            let n = usize::try_from(trailer - at).map_or(buf.len(), |left| left.min(buf.len()));
            self.file
                .read_exact_at(&mut buf[..n], entry.offset + at)
                .map_err(|source| ReadError::Io {
                    path: self.path.clone(),
                    offset: entry.offset + at,
                    source,
                })?;
            crc.update(&buf[..n]);
            at += n as u64;
        }
        let mut stored = [0u8; FRAME_TRAILER_LEN];
        self.file
            .read_exact_at(&mut stored, entry.offset + trailer)
            .map_err(|source| ReadError::Io {
                path: self.path.clone(),
                offset: entry.offset + trailer,
                source,
            })?;
        if crc.finish() != u32::from_le_bytes(stored) {
            return Err(self.corrupt(entry.offset, RecordCorruption::BodyChecksum));
        }
        self.first_touch.verified(seq);
        Ok(())
    }
}
