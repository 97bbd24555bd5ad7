//! The open checkpoint: a side file `<run>.plog.ckpt` recording the frames an earlier open
//! verified (the compact index: 16 bytes a frame, from which each frame's offset and header
//! follow), so a later open need not read and checksum them again. It is a cache: any doubt
//! about it and open verifies the whole file. Layout and guarantees in `docs/format.md`,
//! "Open checkpoint".
//!
//! Reading one is the open's cost, so it is streamed: read in chunks of [`CHUNK`] bytes,
//! checksummed and decoded chunk by chunk into the index, never held whole; the checksum is
//! compared at the end, and an index decoded from a checkpoint that fails it is dropped.

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::crc32c::Crc32c;
use crate::format::{FIELDS_LEN, FrameHeader};
use crate::log::Entry;

/// The checkpoint file's first 8 bytes.
pub(crate) const CHECKPOINT_MAGIC: [u8; 8] = *b"PSYCHCKP";
/// The checkpoint layout's version. Version 1 held each frame's whole 32-byte header (its
/// magic, position and header checksum included); it is refused as of another version,
/// which costs the first open after an upgrade one full verification.
pub(crate) const CHECKPOINT_VERSION: u32 = 2;
/// Bytes before the frame entries: magic, version, the log's header checksum, device,
/// inode, frame count, first frame's offset, end of the last frame.
pub(crate) const CHECKPOINT_HEAD_LEN: usize = 56;
/// Bytes of one frame's entry: the header's fields but its position, magic and checksum
/// ([`FrameHeader::encode_fields`]).
pub(crate) const CHECKPOINT_ENTRY_LEN: usize = FIELDS_LEN;
/// Bytes of the trailing checksum.
const CHECKPOINT_TRAILER_LEN: usize = 4;
/// A writable open writes a checkpoint when it verified at least this many bytes of frames
/// that the checkpoint it found (if any) did not cover. Smaller logs are verified in full
/// at every open.
pub(crate) const CHECKPOINT_AFTER: u64 = 64 << 20;
/// The checkpoint file's name: the log's, with this appended.
pub(crate) const CHECKPOINT_SUFFIX: &str = ".ckpt";

/// The suffix of a checkpoint being written, after the checkpoint's own name (renamed over
/// the checkpoint once written whole).
pub(crate) const WRITING_SUFFIX: &str = ".tmp";
/// Bytes read (and written) at a time: a whole number of entries.
const CHUNK: usize = 4096 * CHECKPOINT_ENTRY_LEN * 16;

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

/// Writes the checkpoint of `entries` (contiguous frames from `identity.frames_start`, in
/// position order from 0) to `out`.
fn encode_to(out: &mut impl Write, identity: &Identity, entries: &[Entry]) -> std::io::Result<()> {
    let end = entries.last().map_or(identity.frames_start, |last| {
        last.offset + last.header.frame_len()
    });
    let mut crc = Crc32c::new();
    let mut head = Vec::with_capacity(CHECKPOINT_HEAD_LEN);
    head.extend_from_slice(&CHECKPOINT_MAGIC);
    head.extend_from_slice(&CHECKPOINT_VERSION.to_le_bytes());
    head.extend_from_slice(&identity.header_crc.to_le_bytes());
    head.extend_from_slice(&identity.dev.to_le_bytes());
    head.extend_from_slice(&identity.ino.to_le_bytes());
    head.extend_from_slice(&(entries.len() as u64).to_le_bytes());
    head.extend_from_slice(&identity.frames_start.to_le_bytes());
    head.extend_from_slice(&end.to_le_bytes());
    crc.update(&head);
    out.write_all(&head)?;
    let mut chunk = Vec::with_capacity(CHUNK.min(entries.len() * CHECKPOINT_ENTRY_LEN));
    for batch in entries.chunks(CHUNK / CHECKPOINT_ENTRY_LEN) {
        chunk.clear();
        for entry in batch {
            chunk.extend_from_slice(&entry.header.encode_fields());
        }
        crc.update(&chunk);
        out.write_all(&chunk)?;
    }
    out.write_all(&crc.finish().to_le_bytes())
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
    tmp.push(WRITING_SUFFIX);
    let tmp = PathBuf::from(tmp);
    // `encode_to` gathers the entries into writes of `CHUNK` bytes itself.
    encode_to(&mut File::create(&tmp)?, identity, entries)?;
    std::fs::rename(&tmp, &path)
}

/// A checkpoint file found beside a log, opened but not yet read.
#[derive(Debug)]
pub(crate) struct Stored {
    file: File,
    len: u64,
}

/// Decodes the checkpoint `stored` and checks it against `identity`: its checksum, its
/// identity, and that its entries hold defined fields and lie back to back from the first
/// frame's offset to the recorded end, which must be within `file_len`. Returns the index
/// entries (positions 0, 1, … in order), or why the checkpoint is refused; a checkpoint
/// that cannot be read is refused too.
pub(crate) fn decode(
    stored: &Stored,
    identity: &Identity,
    file_len: u64,
) -> Result<Vec<Entry>, &'static str> {
    decode_from(&mut &stored.file, stored.len, identity, file_len)
}

/// [`decode`] of the `len` bytes `input` holds.
fn decode_from(
    input: &mut impl Read,
    len: u64,
    identity: &Identity,
    file_len: u64,
) -> Result<Vec<Entry>, &'static str> {
    const UNREADABLE: &str = "cannot be read";
    let entries_len = len
        .checked_sub((CHECKPOINT_HEAD_LEN + CHECKPOINT_TRAILER_LEN) as u64)
        .ok_or("shorter than its fixed part")?;
    let mut head = [0u8; CHECKPOINT_HEAD_LEN];
    input.read_exact(&mut head).map_err(|_| UNREADABLE)?;
    let mut crc = Crc32c::new();
    crc.update(&head);
    let u32_at = |at: usize| {
        let mut raw = [0u8; 4];
        raw.copy_from_slice(&head[at..at + 4]);
        u32::from_le_bytes(raw)
    };
    let u64_at = |at: usize| {
        let mut raw = [0u8; 8];
        raw.copy_from_slice(&head[at..at + 8]);
        u64::from_le_bytes(raw)
    };
    if head[..8] != CHECKPOINT_MAGIC || u32_at(8) != CHECKPOINT_VERSION {
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
    // The count is checked against the file's length before anything is allocated for it.
    if count.checked_mul(CHECKPOINT_ENTRY_LEN as u64) != Some(entries_len) {
        return Err("frame count does not match its length");
    }
    if end > file_len {
        return Err("covers more than the file holds");
    }
    let count = usize::try_from(count).map_err(|_| "frame count does not match its length")?;
    let mut entries = Vec::with_capacity(count);
    let mut offset = identity.frames_start;
    let mut chunk = vec![0u8; CHUNK.min(count.saturating_mul(CHECKPOINT_ENTRY_LEN))];
    while entries.len() < count {
        let take = (count - entries.len())
            .saturating_mul(CHECKPOINT_ENTRY_LEN)
            .min(chunk.len());
        let chunk = &mut chunk[..take];
        input.read_exact(chunk).map_err(|_| UNREADABLE)?;
        crc.update(chunk);
        let (raws, _) = chunk.as_chunks::<CHECKPOINT_ENTRY_LEN>();
        for raw in raws {
            let header = FrameHeader::from_fields(entries.len() as u64, raw);
            if !header.fields_known() {
                return Err("a frame's fields are not defined values");
            }
            entries.push(Entry { offset, header });
            offset = offset
                .checked_add(header.frame_len())
                .filter(|&next| next <= end)
                .ok_or("frames run past its end")?;
        }
    }
    let mut stored = [0u8; CHECKPOINT_TRAILER_LEN];
    input.read_exact(&mut stored).map_err(|_| UNREADABLE)?;
    if stored != crc.finish().to_le_bytes() {
        return Err("checksum mismatch");
    }
    if offset != end {
        return Err("frames do not reach its end");
    }
    Ok(entries)
}

/// Opens the checkpoint of the log at `log_path`, if there is one: `Ok(None)` when there is
/// no checkpoint file.
pub(crate) fn read(log_path: &Path) -> std::io::Result<Option<Stored>> {
    let file = match File::open(path_for(log_path)) {
        Ok(file) => file,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(err) => return Err(err),
    };
    let len = file.metadata()?.len();
    Ok(Some(Stored { file, len }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{CONTENT_NONE, CONTENT_TEXT, KIND_TOOL_RESULT, KIND_USER};

    const IDENTITY: Identity = Identity {
        header_crc: 0xDEAD_BEEF,
        dev: 7,
        ino: 42,
        frames_start: 93,
    };

    /// `count` contiguous frames from `IDENTITY.frames_start`: users and tool results of
    /// various sizes, some failures, write indexes as a few writes of several frames give.
    fn entries(count: u64) -> Vec<Entry> {
        let mut offset = IDENTITY.frames_start;
        (0..count)
            .map(|seq| {
                let header = if seq % 3 == 0 {
                    FrameHeader {
                        seq,
                        kind: KIND_USER,
                        content_kind: CONTENT_NONE,
                        flags: 0,
                        write_index: (seq % 5) as u8,
                        meta_len: 27 + seq as u32,
                        content_len: 0,
                    }
                } else {
                    FrameHeader {
                        seq,
                        kind: KIND_TOOL_RESULT,
                        content_kind: CONTENT_TEXT,
                        flags: (seq % 2) as u8,
                        write_index: (seq % 5) as u8,
                        meta_len: 44,
                        content_len: seq * 1000,
                    }
                };
                let entry = Entry { offset, header };
                offset += header.frame_len();
                entry
            })
            .collect()
    }

    fn encode(identity: &Identity, entries: &[Entry]) -> Vec<u8> {
        let mut out = Vec::new();
        encode_to(&mut out, identity, entries).unwrap();
        out
    }

    fn decode_bytes(bytes: &[u8], file_len: u64) -> Result<Vec<Entry>, &'static str> {
        decode_from(&mut &bytes[..], bytes.len() as u64, &IDENTITY, file_len)
    }

    /// Recomputes the trailing checksum, as a forger would.
    fn reseal(bytes: &mut [u8]) {
        let body = bytes.len() - 4;
        let crc = crate::crc32c::crc32c(&bytes[..body]);
        bytes[body..].copy_from_slice(&crc.to_le_bytes());
    }

    #[test]
    fn documented_layout_matches_the_code() {
        const DOC: &str = include_str!("../docs/format.md");
        let entry = CHECKPOINT_ENTRY_LEN;
        let fixed = CHECKPOINT_HEAD_LEN + CHECKPOINT_TRAILER_LEN;
        for needle in [
            format!("| {CHECKPOINT_HEAD_LEN} | {entry} × `N` |"),
            format!("then {entry} bytes a frame"),
            format!("exactly\n`{fixed} + {entry} N`"),
            format!("chunks of {} MiB", CHUNK >> 20),
        ] {
            assert!(
                DOC.contains(&needle),
                "docs/format.md does not say {needle}"
            );
        }
        let mut head = Vec::new();
        encode_to(&mut head, &IDENTITY, &[]).unwrap();
        assert_eq!(head.len(), fixed);
    }

    #[test]
    fn a_checkpoint_decodes_to_the_index_it_was_written_from() {
        // Over a chunk's worth of entries, so the chunked read and write are crossed.
        for count in [0, 1, 2, 1000, (CHUNK / CHECKPOINT_ENTRY_LEN) as u64 + 3] {
            let entries = entries(count);
            let bytes = encode(&IDENTITY, &entries);
            assert_eq!(
                bytes.len(),
                CHECKPOINT_HEAD_LEN + CHECKPOINT_ENTRY_LEN * count as usize + 4
            );
            let end = entries.last().map_or(IDENTITY.frames_start, |last| {
                last.offset + last.header.frame_len()
            });
            let decoded = decode_bytes(&bytes, end).unwrap();
            assert_eq!(decoded, entries, "{count} entries");
            // The file it covers must hold every frame it names.
            if count > 0 {
                assert_eq!(
                    decode_bytes(&bytes, end - 1).unwrap_err(),
                    "covers more than the file holds"
                );
            }
        }
    }

    #[test]
    fn a_torn_checkpoint_is_refused_at_every_length() {
        // A crash while writing it (the temporary file renamed before its bytes reached the
        // disk) leaves any prefix of it, or its length with zeros at the end.
        let entries = entries(40);
        let bytes = encode(&IDENTITY, &entries);
        let file_len = u64::MAX;
        for cut in 0..bytes.len() {
            assert!(
                decode_bytes(&bytes[..cut], file_len).is_err(),
                "cut at {cut}"
            );
            let mut zeroed = bytes.clone();
            zeroed[cut..].fill(0);
            if zeroed != bytes {
                assert!(decode_bytes(&zeroed, file_len).is_err(), "zeros from {cut}");
            }
        }
        // Bytes past its end (a longer file renamed over, or garbage appended).
        let mut longer = bytes.clone();
        longer.extend_from_slice(&[0u8; CHECKPOINT_ENTRY_LEN]);
        assert!(decode_bytes(&longer, file_len).is_err());
        assert!(decode_bytes(&bytes, file_len).is_ok());
    }

    #[test]
    fn any_flipped_bit_is_refused() {
        let bytes = encode(&IDENTITY, &entries(9));
        for at in 0..bytes.len() {
            for bit in 0..8 {
                let mut bad = bytes.clone();
                bad[at] ^= 1 << bit;
                assert!(
                    decode_bytes(&bad, u64::MAX).is_err(),
                    "bit {bit} of byte {at}"
                );
            }
        }
    }

    #[test]
    fn a_forged_checkpoint_still_names_only_defined_contiguous_frames() {
        let entries = entries(9);
        let bytes = encode(&IDENTITY, &entries);
        let entry_at = |i: usize| CHECKPOINT_HEAD_LEN + i * CHECKPOINT_ENTRY_LEN;
        // `bytes` changed by `forge`, with the checksum recomputed: why it is refused.
        let refusal = |forge: &dyn Fn(&mut Vec<u8>)| {
            let mut bad = bytes.clone();
            forge(&mut bad);
            reseal(&mut bad);
            decode_bytes(&bad, u64::MAX).unwrap_err()
        };
        // An undefined record kind, content kind or flag.
        for (byte, value) in [(0, 9u8), (1, 7), (2, 0x80)] {
            assert_eq!(
                refusal(&|bad| bad[entry_at(4) + byte] = value),
                "a frame's fields are not defined values"
            );
        }
        // A length that overruns the recorded end, or one that falls short of it.
        let len_byte = entry_at(8) + 8;
        assert_eq!(
            refusal(&|bad| bad[len_byte] = bad[len_byte].wrapping_add(1)),
            "frames run past its end"
        );
        assert_eq!(
            refusal(&|bad| bad[len_byte] = bad[len_byte].wrapping_sub(1)),
            "frames do not reach its end"
        );
        // A count that does not match the length: refused before anything is allocated.
        assert_eq!(
            refusal(&|bad| bad[32..40].copy_from_slice(&u64::MAX.to_le_bytes())),
            "frame count does not match its length"
        );
        // Another file's, or another version's.
        let other = Identity {
            ino: 43,
            ..IDENTITY
        };
        let bad = encode(&other, &entries);
        assert_eq!(
            decode_bytes(&bad, u64::MAX).unwrap_err(),
            "belongs to another file"
        );
        assert_eq!(
            refusal(&|bad| bad[8..12].copy_from_slice(&1u32.to_le_bytes())),
            "not a checkpoint of this version"
        );
    }
}
