//! The open checkpoint: a side file `<run>.plog.ckpt` recording the frames an earlier open
//! verified (their headers, hence the index), so a later open need not read and checksum
//! them again. It is a cache: any doubt about it and open verifies the whole file.
//! Layout and guarantees in `docs/format.md`, "Open checkpoint".

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::crc32c::Crc32c;
use crate::format::{FRAME_HEADER_LEN, FrameHeader};
use crate::log::Entry;

/// The checkpoint file's first 8 bytes.
pub(crate) const CHECKPOINT_MAGIC: [u8; 8] = *b"PSYCHCKP";
/// The checkpoint layout's version.
pub(crate) const CHECKPOINT_VERSION: u32 = 1;
/// Bytes before the frame headers: magic, version, the log's header checksum, device,
/// inode, frame count, first frame's offset, end of the last frame.
pub(crate) const CHECKPOINT_HEAD_LEN: usize = 56;
/// A writable open writes a checkpoint when it verified at least this many bytes of frames
/// that the checkpoint it found (if any) did not cover. Smaller logs are verified in full
/// at every open.
pub(crate) const CHECKPOINT_AFTER: u64 = 64 << 20;
/// The checkpoint file's name: the log's, with this appended.
pub(crate) const CHECKPOINT_SUFFIX: &str = ".ckpt";

/// What the checkpoint is checked against: the log file it belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Identity {
    /// The CRC-32C that ends the log's file header (it covers the Run id).
    pub(crate) header_crc: u32,
    /// The log file's device and inode: a checkpoint of another file (a copy, or a log
    /// deleted and created again) names another.
    pub(crate) dev: u64,
    pub(crate) ino: u64,
    /// Where the first frame starts.
    pub(crate) frames_start: u64,
}

impl Identity {
    /// The identity of the open log `file` whose file header ends with `header_crc`.
    pub(crate) fn of(file: &File, header_crc: u32, frames_start: u64) -> std::io::Result<Self> {
        let meta = file.metadata()?;
        Ok(Self {
            header_crc,
            dev: meta.dev(),
            ino: meta.ino(),
            frames_start,
        })
    }
}

/// The checkpoint file of the log at `log_path`.
pub(crate) fn path_for(log_path: &Path) -> PathBuf {
    let mut name = log_path.as_os_str().to_owned();
    name.push(CHECKPOINT_SUFFIX);
    PathBuf::from(name)
}

/// Encodes a checkpoint of `entries` (contiguous frames from `identity.frames_start`).
pub(crate) fn encode(identity: &Identity, entries: &[Entry]) -> Vec<u8> {
    let end = entries.last().map_or(identity.frames_start, |last| {
        last.offset + last.header.frame_len()
    });
    let mut bytes = Vec::with_capacity(CHECKPOINT_HEAD_LEN + entries.len() * FRAME_HEADER_LEN + 4);
    bytes.extend_from_slice(&CHECKPOINT_MAGIC);
    bytes.extend_from_slice(&CHECKPOINT_VERSION.to_le_bytes());
    bytes.extend_from_slice(&identity.header_crc.to_le_bytes());
    bytes.extend_from_slice(&identity.dev.to_le_bytes());
    bytes.extend_from_slice(&identity.ino.to_le_bytes());
    bytes.extend_from_slice(&(entries.len() as u64).to_le_bytes());
    bytes.extend_from_slice(&identity.frames_start.to_le_bytes());
    bytes.extend_from_slice(&end.to_le_bytes());
    for entry in entries {
        bytes.extend_from_slice(&entry.header.encode());
    }
    let mut crc = Crc32c::new();
    crc.update(&bytes);
    bytes.extend_from_slice(&crc.finish().to_le_bytes());
    bytes
}

/// Writes the checkpoint of `entries` for the log at `log_path`: to a temporary file, then
/// renamed over the old one, so a reader finds the old checkpoint or the new one (or, after
/// a crash, one its checksum refuses). Not synced: losing it costs one full verification.
pub(crate) fn write(
    log_path: &Path,
    identity: &Identity,
    entries: &[Entry],
) -> std::io::Result<()> {
    let path = path_for(log_path);
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, encode(identity, entries))?;
    std::fs::rename(&tmp, &path)
}

/// Decodes a checkpoint and checks it against `identity`: its checksum, its identity, and
/// that its headers check out (each header's own checksum), hold positions 0, 1, … in
/// order, and lie back to back from the first frame's offset to the recorded end, which
/// must be within `file_len`. Returns the index entries, or why the checkpoint is refused.
pub(crate) fn decode(
    bytes: &[u8],
    identity: &Identity,
    file_len: u64,
) -> Result<Vec<Entry>, &'static str> {
    let body_len = bytes
        .len()
        .checked_sub(4)
        .filter(|&n| n >= CHECKPOINT_HEAD_LEN)
        .ok_or("shorter than its fixed part")?;
    let (body, stored) = bytes.split_at(body_len);
    let mut crc = Crc32c::new();
    crc.update(body);
    if stored != crc.finish().to_le_bytes() {
        return Err("checksum mismatch");
    }
    let u32_at = |at: usize| {
        let mut raw = [0u8; 4];
        raw.copy_from_slice(&body[at..at + 4]);
        u32::from_le_bytes(raw)
    };
    let u64_at = |at: usize| {
        let mut raw = [0u8; 8];
        raw.copy_from_slice(&body[at..at + 8]);
        u64::from_le_bytes(raw)
    };
    if body[..8] != CHECKPOINT_MAGIC || u32_at(8) != CHECKPOINT_VERSION {
        return Err("not a checkpoint of this version");
    }
    let found = Identity {
        header_crc: u32_at(12),
        dev: u64_at(16),
        ino: u64_at(24),
        frames_start: u64_at(40),
    };
    if found != *identity {
        return Err("belongs to another file");
    }
    let count = u64_at(32);
    let end = u64_at(48);
    let headers = &body[CHECKPOINT_HEAD_LEN..];
    if usize::try_from(count)
        .ok()
        .and_then(|n| n.checked_mul(FRAME_HEADER_LEN))
        != Some(headers.len())
    {
        return Err("frame count does not match its length");
    }
    if end > file_len {
        return Err("covers more than the file holds");
    }
    let mut entries = Vec::with_capacity(headers.len() / FRAME_HEADER_LEN);
    let mut offset = identity.frames_start;
    for (seq, raw) in headers.chunks_exact(FRAME_HEADER_LEN).enumerate() {
        let mut head = [0u8; FRAME_HEADER_LEN];
        head.copy_from_slice(raw);
        let header = FrameHeader::decode(&head).map_err(|_| "a frame header does not check out")?;
        if header.seq != seq as u64 {
            return Err("frames out of order");
        }
        entries.push(Entry { offset, header });
        offset = offset
            .checked_add(header.frame_len())
            .filter(|&next| next <= end)
            .ok_or("frames run past its end")?;
    }
    if offset != end {
        return Err("frames do not reach its end");
    }
    Ok(entries)
}

/// Reads the checkpoint of the log at `log_path`, if there is one: `Ok(None)` when there is
/// no checkpoint file.
pub(crate) fn read(log_path: &Path) -> std::io::Result<Option<Vec<u8>>> {
    match std::fs::read(path_for(log_path)) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(err),
    }
}
