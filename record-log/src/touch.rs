//! Check on first touch: the frames an open took from the checkpoint (`docs/format.md`,
//! "Open checkpoint") had their body checksums checked by an earlier open, not by this
//! process. The first content read of such a frame in this process checksums its whole
//! body (streamed, in bounded memory) and remembers it as verified, so every byte of a
//! result's content a read serves was checksummed at open, at append, or here; a mismatch
//! is [`ReadError::Corrupt`] on that read and on every later one.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::log::Entry;
use crate::{ReadError, RecordCorruption, RecordLog};

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
        let holds = self
            .body_checksum_holds(entry.offset, &entry.header)
            .map_err(|(offset, source)| self.read_io(offset)(source))?;
        if !holds {
            return Err(self.corrupt(entry.offset, RecordCorruption::BodyChecksum));
        }
        self.first_touch.verified(seq);
        Ok(())
    }
}
