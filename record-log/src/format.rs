//! The on-disk format, byte by byte (documented in `docs/format.md`): the file header, the
//! frame header, and how a [`Record`] splits into a metadata part and a content part.
//!
//! Everything here is pure: bytes in, values out. Integers are little-endian.

use psych_types::{
    BlobResource, BlockLines, ContentBlock, EmbeddedResource, JsonObject, LineMark, MediaContent,
    OutputKind, Record, ResourceContents, RunId, TextContent, TextResource, TokenEstimator,
    ToolCallId, ToolOutput, ToolRef, ToolResult,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::cause::{FrameDamage, RecordCorruption};
use crate::crc32c::{Crc32c, crc32c};
use crate::error::AppendError;
use crate::spill::{Readable, Streamed};

/// The first eight bytes of every log file.
pub(crate) const FILE_MAGIC: [u8; 8] = *b"PSYCHLOG";
/// The on-disk format version this build writes in a log's file header, and the only one it
/// reads (`docs/format.md`).
pub const FORMAT_VERSION: u16 = 3;
/// Bytes of the file header before the Run id: magic, version, Run id length.
pub(crate) const FILE_HEADER_FIXED: usize = 12;
/// The first four bytes of every frame.
pub(crate) const FRAME_MAGIC: [u8; 4] = *b"PSRF";
/// The first four bytes of the end mark that follows the last frame.
pub(crate) const END_MAGIC: [u8; 4] = *b"PSEM";
/// Bytes of the end mark.
pub(crate) const END_MARK_LEN: usize = 24;
/// Bytes of a frame header.
pub(crate) const FRAME_HEADER_LEN: usize = 32;
/// Bytes of the trailing body checksum of a frame.
pub(crate) const FRAME_TRAILER_LEN: usize = 4;
/// The file name extension of a Run's log.
pub(crate) const FILE_EXTENSION: &str = "plog";

/// Record kind byte: a user message.
pub(crate) const KIND_USER: u8 = 1;
/// Record kind byte: an assistant message.
pub(crate) const KIND_ASSISTANT: u8 = 2;
/// Record kind byte: a tool result.
pub(crate) const KIND_TOOL_RESULT: u8 = 3;
/// Record kind byte: the usage a provider reported for one model call.
pub(crate) const KIND_USAGE: u8 = 4;

/// Content kind byte: no content (user, assistant and usage records).
pub(crate) const CONTENT_NONE: u8 = 0;
/// Content kind byte: content blocks without binary data; the content is the readable text.
pub(crate) const CONTENT_TEXT: u8 = 1;
/// Content kind byte: structured content only; the content is its JSON text view.
pub(crate) const CONTENT_JSON: u8 = 2;
/// Content kind byte: content blocks with binary data; the content is the readable text's
/// length (u64), the readable text, then each binary block's bytes in block order.
pub(crate) const CONTENT_WITH_BINARY: u8 = 3;

/// Flag bit: the tool reported a failure.
pub(crate) const FLAG_IS_ERROR: u8 = 1;

/// Bytes of one slot of the high-water mark.
pub(crate) const MARK_LEN: usize = 36;
/// Slots of the high-water mark, right after the file header; writes alternate between them.
pub(crate) const MARK_SLOTS: usize = 2;

/// The largest write index a frame header holds (byte 15): frames further into one write
/// all hold this value.
pub(crate) const MAX_WRITE_INDEX: u8 = u8::MAX;

/// The write index (byte 15) of the `i`-th frame (from 0) of one write, capped at
/// [`MAX_WRITE_INDEX`].
pub(crate) fn write_index(i: usize) -> u8 {
    u8::try_from(i).unwrap_or(MAX_WRITE_INDEX)
}

/// The whole file header for `run`: magic, version, Run id length and bytes, CRC-32C.
pub(crate) fn file_header(run: &RunId) -> Vec<u8> {
    let id = run.as_str().as_bytes();
    let mut out = Vec::with_capacity(FILE_HEADER_FIXED + id.len() + 4);
    out.extend_from_slice(&FILE_MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    // A RunId is at most 64 bytes, so its length fits a u16.
    out.extend_from_slice(&(id.len() as u16).to_le_bytes());
    out.extend_from_slice(id);
    let crc = crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// The file header for `run` followed by both slots of the high-water mark of an empty log
/// and the end mark of no records: what a new file starts with.
pub(crate) fn initial_file_start(run: &RunId) -> Vec<u8> {
    let mut out = file_header(run);
    let frames_start = (out.len() + MARK_SLOTS * MARK_LEN) as u64;
    let mark = Mark::initial(frames_start).encode();
    for _ in 0..MARK_SLOTS {
        out.extend_from_slice(&mark);
    }
    out.extend_from_slice(&EndMark::new(0, frames_start).encode());
    out
}

/// The end mark: written right after the last frame in the same write as the frames (and
/// overwritten by the next write, which starts where it starts), so that `open` can tell
/// the log's end from frames zeroed or cut off after it (`docs/format.md`, "End mark").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EndMark {
    /// Records in the log: the frames before the mark.
    pub(crate) records: u64,
    /// Byte offset of the mark itself: where the last frame ends.
    pub(crate) at: u64,
}

impl EndMark {
    /// The end mark after `records` frames ending at byte `at`.
    pub(crate) fn new(records: u64, at: u64) -> Self {
        Self { records, at }
    }

    /// The mark's bytes: magic, records, offset, CRC-32C of the 20 bytes before it.
    pub(crate) fn encode(&self) -> [u8; END_MARK_LEN] {
        let mut out = [0u8; END_MARK_LEN];
        out[0..4].copy_from_slice(&END_MAGIC);
        out[4..12].copy_from_slice(&self.records.to_le_bytes());
        out[12..20].copy_from_slice(&self.at.to_le_bytes());
        let crc = crc32c(&out[0..20]);
        out[20..24].copy_from_slice(&crc.to_le_bytes());
        out
    }

    /// Parses an end mark; `None` unless the magic and checksum hold.
    pub(crate) fn decode(bytes: &[u8]) -> Option<Self> {
        let bytes: &[u8; END_MARK_LEN] = bytes.try_into().ok()?;
        let field = |at: usize| {
            let mut le = [0u8; 8];
            le.copy_from_slice(&bytes[at..at + 8]);
            u64::from_le_bytes(le)
        };
        let stored = u32::from_le_bytes([bytes[20], bytes[21], bytes[22], bytes[23]]);
        (bytes[0..4] == END_MAGIC && crc32c(&bytes[0..20]) == stored).then(|| Self {
            records: field(4),
            at: field(12),
        })
    }
}

/// The high-water mark: what the last sync of the log made durable, so that `open` can tell
/// frames lost after they were synced from a write a crash cut short (`docs/format.md`,
/// "High-water mark"). Written into slot `generation % 2` by a sync that commits a new
/// file length anyway (before its `fdatasync`), by `sync()` under `OsBuffered`, at open's
/// cuts, and unsynced when the log is closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Mark {
    /// Counts the marks written; the valid slot with the larger one is the current mark.
    pub(crate) generation: u64,
    /// Records already durable before the sync that wrote this mark began: a completed
    /// earlier sync made them so.
    pub(crate) durable_records: u64,
    /// Byte offset where the frame of record `durable_records` starts: the end of the
    /// durable frames.
    pub(crate) durable_end: u64,
    /// Records in the file once the sync that wrote this mark returns.
    pub(crate) written_records: u64,
}

impl Mark {
    /// The mark of an empty log whose frames start at `frames_start`.
    pub(crate) fn initial(frames_start: u64) -> Self {
        Self {
            generation: 0,
            durable_records: 0,
            durable_end: frames_start,
            written_records: 0,
        }
    }

    /// The slot this mark is written to.
    pub(crate) fn slot(&self) -> usize {
        (self.generation % MARK_SLOTS as u64) as usize
    }

    /// The slot's bytes, checksum included.
    pub(crate) fn encode(&self) -> [u8; MARK_LEN] {
        let mut out = [0u8; MARK_LEN];
        out[0..8].copy_from_slice(&self.generation.to_le_bytes());
        out[8..16].copy_from_slice(&self.durable_records.to_le_bytes());
        out[16..24].copy_from_slice(&self.durable_end.to_le_bytes());
        out[24..32].copy_from_slice(&self.written_records.to_le_bytes());
        let crc = crc32c(&out[0..32]);
        out[32..36].copy_from_slice(&crc.to_le_bytes());
        out
    }

    /// Parses one slot; `None` when its checksum fails (a slot torn by a crash, or damaged)
    /// or it counts fewer records written than durable.
    pub(crate) fn decode(bytes: &[u8]) -> Option<Self> {
        let bytes: &[u8; MARK_LEN] = bytes.try_into().ok()?;
        let field = |at: usize| {
            let mut le = [0u8; 8];
            le.copy_from_slice(&bytes[at..at + 8]);
            u64::from_le_bytes(le)
        };
        let stored = u32::from_le_bytes([bytes[32], bytes[33], bytes[34], bytes[35]]);
        if crc32c(&bytes[0..32]) != stored {
            return None;
        }
        let mark = Self {
            generation: field(0),
            durable_records: field(8),
            durable_end: field(16),
            written_records: field(24),
        };
        (mark.durable_records <= mark.written_records).then_some(mark)
    }

    /// The current mark among the slots (`MARK_SLOTS * MARK_LEN` bytes): the valid one of
    /// the larger generation. `None` when no slot is valid.
    pub(crate) fn newest(slots: &[u8]) -> Option<Self> {
        slots
            .chunks_exact(MARK_LEN)
            .filter_map(Self::decode)
            .max_by_key(|mark| mark.generation)
    }
}

/// What a file header that is not the expected one says instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HeaderFault {
    /// The file does not start with [`FILE_MAGIC`].
    NotALog,
    /// A valid header of another format version.
    Version(u16),
    /// A valid header naming another Run.
    OtherRun(String),
    /// The magic is right but the rest does not check out.
    Damaged,
}

/// Explains why `bytes` (the start of a file, at least as long as `expected`) does not
/// begin with the `expected` header.
pub(crate) fn header_fault(bytes: &[u8]) -> HeaderFault {
    if bytes.len() < FILE_HEADER_FIXED || bytes[..8] != FILE_MAGIC {
        return HeaderFault::NotALog;
    }
    let version = u16::from_le_bytes([bytes[8], bytes[9]]);
    let id_len = usize::from(u16::from_le_bytes([bytes[10], bytes[11]]));
    let end = FILE_HEADER_FIXED + id_len;
    let Some(stored) = bytes.get(end..end + 4) else {
        return HeaderFault::Damaged;
    };
    let stored = u32::from_le_bytes([stored[0], stored[1], stored[2], stored[3]]);
    if crc32c(&bytes[..end]) != stored {
        return HeaderFault::Damaged;
    }
    if version != FORMAT_VERSION {
        return HeaderFault::Version(version);
    }
    HeaderFault::OtherRun(String::from_utf8_lossy(&bytes[FILE_HEADER_FIXED..end]).into_owned())
}

/// The fixed header of one frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FrameHeader {
    /// The record's position in its Run.
    pub(crate) seq: u64,
    /// One of the `KIND_*` bytes.
    pub(crate) kind: u8,
    /// One of the `CONTENT_*` bytes.
    pub(crate) content_kind: u8,
    /// `FLAG_*` bits.
    pub(crate) flags: u8,
    /// The frame's index within the write that put it on disk (0 for the first frame of a
    /// write, `k` for the `k`-th after it), capped at [`MAX_WRITE_INDEX`]: lets `open` tell a
    /// torn final write from damage in an earlier one (`docs/format.md`, "Recovery on open").
    pub(crate) write_index: u8,
    /// Length of the metadata.
    pub(crate) meta_len: u32,
    /// Length of the content.
    pub(crate) content_len: u64,
}

/// Bytes of a frame header's fields after its position ([`FrameHeader::encode_fields`]).
pub(crate) const FIELDS_LEN: usize = 16;

impl FrameHeader {
    /// Total frame length: header, metadata, content, trailer.
    /// Saturates rather than overflows on a forged length, so a hostile header is merely
    /// longer than any file.
    pub(crate) fn frame_len(&self) -> u64 {
        (FRAME_HEADER_LEN + FRAME_TRAILER_LEN) as u64
            + u64::from(self.meta_len)
            + self.content_len.min(u64::MAX / 2)
    }

    /// Offset of the content from the frame's start.
    pub(crate) fn content_start(&self) -> u64 {
        FRAME_HEADER_LEN as u64 + u64::from(self.meta_len)
    }

    /// The 32 header bytes, checksum included.
    pub(crate) fn encode(&self) -> [u8; FRAME_HEADER_LEN] {
        let mut out = [0u8; FRAME_HEADER_LEN];
        out[0..4].copy_from_slice(&FRAME_MAGIC);
        out[4..12].copy_from_slice(&self.seq.to_le_bytes());
        out[12..28].copy_from_slice(&self.encode_fields());
        let crc = crc32c(&out[0..28]);
        out[28..32].copy_from_slice(&crc.to_le_bytes());
        out
    }

    /// The fields after the position, as bytes 12 to 28 of the header hold them: kind,
    /// content kind, flags, write index (a byte each), the metadata length (u32) and the
    /// content length (u64). Also a frame's entry in the open checkpoint.
    pub(crate) fn encode_fields(&self) -> [u8; FIELDS_LEN] {
        let mut out = [0u8; FIELDS_LEN];
        out[0] = self.kind;
        out[1] = self.content_kind;
        out[2] = self.flags;
        out[3] = self.write_index;
        out[4..8].copy_from_slice(&self.meta_len.to_le_bytes());
        out[8..16].copy_from_slice(&self.content_len.to_le_bytes());
        out
    }

    /// The header of frame `seq` whose other fields are `fields` ([`Self::encode_fields`]),
    /// unchecked.
    pub(crate) fn from_fields(seq: u64, fields: &[u8; FIELDS_LEN]) -> Self {
        let mut content_len = [0u8; 8];
        content_len.copy_from_slice(&fields[8..16]);
        Self {
            seq,
            kind: fields[0],
            content_kind: fields[1],
            flags: fields[2],
            write_index: fields[3],
            meta_len: u32::from_le_bytes([fields[4], fields[5], fields[6], fields[7]]),
            content_len: u64::from_le_bytes(content_len),
        }
    }

    /// Parses and checks 32 header bytes.
    pub(crate) fn decode(bytes: &[u8; FRAME_HEADER_LEN]) -> Result<Self, FrameDamage> {
        if bytes[0..4] != FRAME_MAGIC {
            return Err(FrameDamage::NoMagic);
        }
        let stored = u32::from_le_bytes([bytes[28], bytes[29], bytes[30], bytes[31]]);
        if crc32c(&bytes[0..28]) != stored {
            return Err(FrameDamage::HeaderChecksum);
        }
        let mut seq = [0u8; 8];
        seq.copy_from_slice(&bytes[4..12]);
        let mut fields = [0u8; FIELDS_LEN];
        fields.copy_from_slice(&bytes[12..28]);
        let header = Self::from_fields(u64::from_le_bytes(seq), &fields);
        if !header.fields_known() {
            return Err(FrameDamage::UndefinedFields);
        }
        Ok(header)
    }

    /// Whether the kind, content kind and flags are values the format defines, together
    /// (a frame whose header checksum holds but fails this is treated as damaged). Also
    /// checked for each frame an open takes from its checkpoint.
    pub(crate) fn fields_known(&self) -> bool {
        match self.kind {
            KIND_USER | KIND_ASSISTANT | KIND_USAGE => {
                self.content_kind == CONTENT_NONE && self.content_len == 0 && self.flags == 0
            }
            KIND_TOOL_RESULT => {
                (CONTENT_TEXT..=CONTENT_WITH_BINARY).contains(&self.content_kind)
                    && self.flags & !FLAG_IS_ERROR == 0
            }
            _ => false,
        }
    }
}

/// The metadata of a tool result: everything but the readable text and the binary data.
#[derive(Debug, Serialize, Deserialize)]
struct ResultMeta {
    call_id: ToolCallId,
    name: String,
    /// The remote tool the call reached; absent for Psych's own answers and in records
    /// written before it was stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    target: Option<ToolRef>,
    /// The content blocks without their bulk; absent when the result is exactly one text
    /// block with nothing but its text (the readable text is that text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    blocks: Option<Vec<StoredBlock>>,
    /// `structuredContent` when the readable text is not its text view (the result has
    /// content blocks); with no block it is parsed back from the content.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    structured: Option<Value>,
    /// The result's `_meta`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    meta: Option<JsonObject>,
    /// The token estimate of the whole output, by the estimator the log was given
    /// (`RecordLog::set_estimator`) when it was appended; absent without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    estimate: Option<u64>,
    /// Line breaks (`\n` bytes) in the readable text; absent in records written before it
    /// was stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    line_breaks: Option<u64>,
    /// The readable text's sparse line index; absent for a text of at most one stride, and
    /// in records written before it was stored. Written only: a summary does not need it
    /// (serde skips the string without copying it); [`line_mark`] reads it alone.
    #[serde(default, skip_serializing_if = "Option::is_none", skip_deserializing)]
    line_index: Option<LineIndex>,
}

/// The smallest stride of a line index, in bytes of readable text: a result this long or
/// shorter has no index (counting its lines from byte 0 reads at most this much).
pub(crate) const LINE_INDEX_MIN_STRIDE: u64 = 128 << 10;

/// The most entries a line index holds: the stride doubles from
/// [`LINE_INDEX_MIN_STRIDE`] until the entries fit, so an index is at most
/// `8 * (LINE_INDEX_MAX_ENTRIES - 1)` characters of metadata (16 KiB) whatever the
/// result's size; up to 256 MiB, one entry per 128 KiB.
pub(crate) const LINE_INDEX_MAX_ENTRIES: u64 = 2048;

/// Bytes of one entry before base64: a line count as an unsigned 48-bit little-endian
/// integer (6 bytes, 8 base64 characters, so an entry is found by its position).
const LINE_INDEX_ENTRY_BYTES: usize = 6;

/// Characters of one entry in the base64 string.
const LINE_INDEX_ENTRY_CHARS: usize = 8;

/// A result's sparse line index as it is written in its metadata (`docs/format.md`,
/// "Metadata"): entry `k` (from 1) is the number of line breaks in the first
/// `k * stride` bytes of the readable text, for each `k * stride` inside the text.
#[derive(Debug, Serialize)]
struct LineIndex {
    /// Bytes of readable text between entries.
    stride: u64,
    /// The entries, each 6 bytes (u48 little-endian), as standard base64.
    breaks: String,
}

/// The stride of the line index of a readable text of `len` bytes: the smallest power of
/// two of at least [`LINE_INDEX_MIN_STRIDE`] that keeps the entries within
/// [`LINE_INDEX_MAX_ENTRIES`].
pub(crate) fn line_index_stride(len: u64) -> u64 {
    len.div_ceil(LINE_INDEX_MAX_ENTRIES)
        .next_power_of_two()
        .max(LINE_INDEX_MIN_STRIDE)
}

/// The line breaks of `text` and, when it is longer than one stride, its line index:
/// one pass, counting a stride at a time.
#[cfg(test)]
fn index_lines(text: &[u8]) -> (u64, Option<LineIndex>) {
    index_lines_by(text, line_index_stride(text.len() as u64))
}

/// [`index_lines`] with the given stride (tests take small ones).
#[cfg(test)]
fn index_lines_by(text: &[u8], stride: u64) -> (u64, Option<LineIndex>) {
    let mut indexer = LineIndexer::with_stride(text.len() as u64, stride);
    indexer.feed(text);
    indexer.finish()
}

/// Counts the line breaks of a readable text of a known length fed in pieces (in memory,
/// or streamed from a spill file), and builds its line index a stride at a time: the
/// same counts and index whatever the pieces, since entries fall at fixed offsets. Holds
/// the index only (at most 12 KiB of entries before base64).
#[derive(Debug)]
pub(crate) struct LineIndexer {
    stride: u64,
    /// Entries to write: one for each `k * stride` inside the text (before its last
    /// byte), none when the text is at most one stride long or too long to count in
    /// 48 bits.
    entries: u64,
    /// Bytes fed so far.
    fed: u64,
    /// Line breaks fed so far.
    total: u64,
    raw: Vec<u8>,
}

impl LineIndexer {
    /// An indexer for a readable text of `len` bytes.
    pub(crate) fn new(len: u64) -> Self {
        Self::with_stride(len, line_index_stride(len))
    }

    /// An indexer for `len` bytes with the given stride (tests take small ones).
    fn with_stride(len: u64, stride: u64) -> Self {
        // A count fits 48 bits when the text does; a text of 256 TiB has no index.
        let entries = if len >= 1 << 48 {
            0
        } else {
            len.saturating_sub(1) / stride
        };
        Self {
            stride,
            entries,
            fed: 0,
            total: 0,
            raw: Vec::with_capacity(entries as usize * LINE_INDEX_ENTRY_BYTES),
        }
    }

    /// Feeds the next bytes of the text.
    pub(crate) fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let written = (self.raw.len() / LINE_INDEX_ENTRY_BYTES) as u64;
            if written >= self.entries {
                self.total += psych_types::count_line_breaks(bytes);
                self.fed += bytes.len() as u64;
                return;
            }
            let boundary = (written + 1) * self.stride;
            let take = usize::try_from(boundary - self.fed)
                .map_or(bytes.len(), |left| left.min(bytes.len()));
            self.total += psych_types::count_line_breaks(&bytes[..take]);
            self.fed += take as u64;
            if self.fed == boundary {
                self.raw
                    .extend_from_slice(&self.total.to_le_bytes()[..LINE_INDEX_ENTRY_BYTES]);
            }
            bytes = &bytes[take..];
        }
    }

    /// Line breaks fed so far.
    pub(crate) fn line_breaks(&self) -> u64 {
        self.total
    }

    /// The line breaks fed and the index, if the text has one.
    fn finish(self) -> (u64, Option<LineIndex>) {
        if self.entries == 0 {
            return (self.total, None);
        }
        let breaks = psych_types::encode_base64(&self.raw);
        (
            self.total,
            Some(LineIndex {
                stride: self.stride,
                breaks,
            }),
        )
    }
}

/// The line index member alone, borrowed from the metadata.
#[derive(Deserialize)]
struct LineIndexOnly<'a> {
    #[serde(default, borrow)]
    line_index: Option<LineIndexRef<'a>>,
}

#[derive(Deserialize)]
struct LineIndexRef<'a> {
    stride: u64,
    #[serde(borrow)]
    breaks: &'a str,
}

/// The value of one standard base64 character.
fn base64_value(c: u8) -> Option<u64> {
    Some(u64::from(match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => return None,
    }))
}

/// Entry `i` (from 0) of a line index's base64 string: 8 characters, 48 bits.
fn line_index_entry(breaks: &[u8], i: usize) -> Option<u64> {
    let chars = breaks.get(i * LINE_INDEX_ENTRY_CHARS..(i + 1) * LINE_INDEX_ENTRY_CHARS)?;
    // Big-endian bits of 8 characters give the 6 bytes in order; they are little-endian.
    let mut bits = 0u64;
    for &c in chars {
        bits = bits << 6 | base64_value(c)?;
    }
    let bytes = bits.to_be_bytes();
    let mut le = [0u8; 8];
    le[..LINE_INDEX_ENTRY_BYTES].copy_from_slice(&bytes[2..]);
    Some(u64::from_le_bytes(le))
}

/// Where to count from to reach line `line` (see `RecordSource::line_mark`) of a tool
/// result whose metadata is `meta` and readable text `len` bytes: the last entry of its
/// line index with fewer than `line` line breaks before it, found by binary search over
/// the base64 string without decoding the rest; the start of the text when it has no
/// index (shorter than a stride, or written before the index was).
pub(crate) fn line_mark(meta: &[u8], len: u64, line: u64) -> Result<LineMark, RecordCorruption> {
    let only: LineIndexOnly<'_> =
        serde_json::from_slice(meta).map_err(|_| RecordCorruption::Metadata)?;
    let Some(index) = only.line_index else {
        return Ok(LineMark::START);
    };
    let breaks = index.breaks.as_bytes();
    let entries = breaks.len() / LINE_INDEX_ENTRY_CHARS;
    let fits = index.stride > 0
        && breaks.len() % LINE_INDEX_ENTRY_CHARS == 0
        && index
            .stride
            .checked_mul(entries as u64)
            .is_some_and(|last| last < len);
    if !fits {
        return Err(RecordCorruption::LineIndex);
    }
    let entry = |i: usize| line_index_entry(breaks, i).ok_or(RecordCorruption::LineIndex);
    // Invariant: the mark `lo` (0 is the text's start) has fewer than `line` breaks
    // before it, and the last such mark is at most `hi`.
    let (mut lo, mut hi) = (0usize, entries);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if entry(mid - 1)? < line {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    if lo == 0 {
        return Ok(LineMark::START);
    }
    let at = index.stride * lo as u64;
    let breaks_before = entry(lo - 1)?;
    if breaks_before > at {
        return Err(RecordCorruption::LineIndex);
    }
    Ok(LineMark { at, breaks_before })
}

/// A member that is present is `Some`, even when it is `null`.
fn present<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(deserializer).map(Some)
}

/// The fields of [`ResultMeta`] a summary reads: `structured` and `_meta` are passed over
/// without building their values (a peer's structured content may be tens of MiB of small
/// values, each a JSON value of 32 bytes or more in memory), as is the line index.
#[derive(Debug, Deserialize)]
struct SummaryMeta {
    call_id: ToolCallId,
    name: String,
    #[serde(default)]
    target: Option<ToolRef>,
    #[serde(default)]
    blocks: Option<Vec<StoredBlock>>,
    #[serde(default)]
    estimate: Option<u64>,
    #[serde(default)]
    line_breaks: Option<u64>,
}

/// One content block without its bulk (its text, or its binary data), and where the bulk is.
#[derive(Debug, Serialize, Deserialize)]
struct StoredBlock {
    /// The block as MCP JSON with its bulk emptied (`"text": ""`, `"data": ""`, `"blob": ""`).
    block: JsonObject,
    /// Where the bulk lies: in the readable text for text, in the binary area for data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    at: Option<u64>,
    /// The bulk's length in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    len: Option<u64>,
}

/// A record split for storage: header fields, metadata and the content.
#[derive(Debug)]
pub(crate) struct Encoded<'a> {
    pub(crate) kind: u8,
    pub(crate) content_kind: u8,
    pub(crate) flags: u8,
    pub(crate) meta: Vec<u8>,
    pub(crate) content: Content<'a>,
}

/// A frame's content: in memory, or (a tool result with spilled text) streamed from its
/// spill files as the frame is written.
#[derive(Debug)]
pub(crate) enum Content<'a> {
    /// The content's bytes.
    Memory(std::borrow::Cow<'a, [u8]>),
    /// The content's pieces, the spilled texts among them read as they are written.
    Streamed(Streamed<'a>),
}

impl Content<'_> {
    /// The content's length in bytes.
    pub(crate) fn len(&self) -> u64 {
        match self {
            Content::Memory(bytes) => bytes.len() as u64,
            Content::Streamed(streamed) => streamed.len(),
        }
    }
}

#[cfg(test)]
impl Content<'_> {
    /// The bytes of an in-memory content (tests only).
    fn bytes(&self) -> &[u8] {
        match self {
            Content::Memory(bytes) => bytes,
            Content::Streamed(_) => panic!("a streamed content has no bytes in memory"),
        }
    }
}

/// `block` with its bulk emptied, as a JSON object.
fn skeleton(block: &ContentBlock) -> Result<JsonObject, serde_json::Error> {
    let emptied;
    let block = match block {
        ContentBlock::Text(text) => {
            emptied = ContentBlock::Text(TextContent {
                text: String::new(),
                annotations: text.annotations.clone(),
                meta: text.meta.clone(),
                extra: text.extra.clone(),
            });
            &emptied
        }
        ContentBlock::Image(media) | ContentBlock::Audio(media) => {
            let media = MediaContent {
                data: Vec::new(),
                mime_type: media.mime_type.clone(),
                annotations: media.annotations.clone(),
                meta: media.meta.clone(),
                extra: media.extra.clone(),
            };
            emptied = if matches!(block, ContentBlock::Image(_)) {
                ContentBlock::Image(media)
            } else {
                ContentBlock::Audio(media)
            };
            &emptied
        }
        ContentBlock::Resource(embedded) => {
            let resource = match &embedded.resource {
                ResourceContents::Text(text) => ResourceContents::Text(TextResource {
                    text: String::new(),
                    uri: text.uri.clone(),
                    mime_type: text.mime_type.clone(),
                    meta: text.meta.clone(),
                    extra: text.extra.clone(),
                }),
                ResourceContents::Blob(blob) => ResourceContents::Blob(BlobResource {
                    blob: Vec::new(),
                    uri: blob.uri.clone(),
                    mime_type: blob.mime_type.clone(),
                    meta: blob.meta.clone(),
                    extra: blob.extra.clone(),
                }),
            };
            emptied = ContentBlock::Resource(EmbeddedResource {
                resource,
                annotations: embedded.annotations.clone(),
                meta: embedded.meta.clone(),
                extra: embedded.extra.clone(),
            });
            &emptied
        }
        other => other,
    };
    match serde_json::to_value(block)? {
        Value::Object(map) => Ok(map),
        // A block always serializes as an object.
        _ => Ok(JsonObject::new()),
    }
}

/// `json` if it nests no deeper than serde_json reads back, else
/// [`AppendError::TooDeep`]: a record is refused rather than stored unreadable.
fn readable_depth<T: AsRef<[u8]>>(json: T) -> Result<T, AppendError> {
    match psych_types::json::past_max_depth(json.as_ref()) {
        Some(depth) => Err(AppendError::TooDeep {
            depth,
            max: psych_types::json::MAX_DEPTH,
        }),
        None => Ok(json),
    }
}

/// Whether `output` is one text block with nothing but its text.
fn plain_text(output: &ToolOutput) -> bool {
    matches!(output.content.as_slice(), [ContentBlock::Text(text)]
        if text.annotations.is_none() && text.meta.is_none() && text.extra.is_empty())
}

/// Splits `record` into metadata and content.
///
/// A tool result's metadata also stores its readable text's line breaks, its line index
/// when the text is longer than one stride, and, when `estimator` is given, its token
/// estimate. A tool result with spilled text blocks (`ToolOutput::spilled`) gets the
/// metadata the same result with those texts in memory would, and content streamed from
/// the spill files ([`Content::Streamed`]): encoding it reads every spill file through
/// once, in chunks (see `spill.rs`), so it blocks.
pub(crate) fn encode_record<'a>(
    record: &'a Record,
    estimator: Option<&dyn TokenEstimator>,
) -> Result<Encoded<'a>, AppendError> {
    use std::borrow::Cow;
    match record {
        Record::User(_) | Record::Assistant(_) | Record::Usage(_) => Ok(Encoded {
            kind: match record {
                Record::User(_) => KIND_USER,
                Record::Assistant(_) => KIND_ASSISTANT,
                _ => KIND_USAGE,
            },
            content_kind: CONTENT_NONE,
            flags: 0,
            meta: readable_depth(serde_json::to_vec(record).map_err(AppendError::Encode)?)?,
            content: Content::Memory(Cow::Borrowed(&[])),
        }),
        Record::ToolResult(result) => {
            let output = &result.output;
            let (readable, mut spans) = output.readable_text_spans();
            let mut readable = Readable::of(output, readable, &mut spans)?;
            let mut lines = LineIndexer::new(readable.len());
            let binary_estimate = |estimator: &dyn TokenEstimator| {
                output.binary_blocks().fold(0u64, |sum, (_, block)| {
                    sum.saturating_add(
                        estimator.estimate_binary(block.mime_type, block.data.len() as u64),
                    )
                })
            };
            let estimate = if readable.is_spilled() {
                // Summed over the text's pieces and chunks: see `docs/format.md`,
                // "Streamed appends".
                let text = readable.scan(&mut lines, estimator)?;
                estimator.map(|estimator| text.saturating_add(binary_estimate(estimator)))
            } else {
                lines.feed(readable.memory());
                estimator.map(|estimator| estimator.estimate_output(output))
            };
            let (line_breaks, line_index) = lines.finish();
            let json_only = output.shows_structured_content();
            let mut blocks = None;
            let mut binary: Vec<&[u8]> = Vec::new();
            if !plain_text(output) && !json_only {
                let mut stored = Vec::with_capacity(output.content.len());
                let mut binary_at = 0u64;
                for (block, span) in output.content.iter().zip(&spans) {
                    let (at, len) = if let Some(span) = span {
                        (Some(span.start as u64), Some(span.len() as u64))
                    } else if let Some(data) = block.binary() {
                        let at = binary_at;
                        binary_at += data.data.len() as u64;
                        binary.push(data.data);
                        (Some(at), Some(data.data.len() as u64))
                    } else {
                        (None, None)
                    };
                    stored.push(StoredBlock {
                        block: skeleton(block).map_err(AppendError::Encode)?,
                        at,
                        len,
                    });
                }
                blocks = Some(stored);
            }
            // Structured content shown as the readable text is stored only as that text and
            // parsed back on read: exact because the canonical writer prints the shortest
            // round-tripping float and this crate turns on `float_roundtrip` parsing.
            let meta = serde_json::to_vec(&ResultMeta {
                target: result.target.clone(),
                call_id: result.call_id.clone(),
                name: result.name.clone(),
                blocks,
                structured: if json_only {
                    None
                } else {
                    output.structured_content.clone()
                },
                meta: output.meta.clone(),
                estimate,
                line_breaks: Some(line_breaks),
                line_index,
            })
            .map_err(AppendError::Encode)?;
            let meta = readable_depth(meta)?;
            let readable_len = readable.len();
            let (content_kind, content) = if readable.is_spilled() {
                // Spilled text is in content blocks, so never JSON only.
                let with_binary = !binary.is_empty();
                (
                    if with_binary {
                        CONTENT_WITH_BINARY
                    } else {
                        CONTENT_TEXT
                    },
                    Content::Streamed(Streamed {
                        prefix: with_binary.then(|| readable_len.to_le_bytes()),
                        readable,
                        binary: binary.into_iter().map(Cow::Borrowed).collect(),
                    }),
                )
            } else {
                let memory = readable.into_memory();
                if json_only {
                    let memory = readable_depth(memory)?;
                    (CONTENT_JSON, Content::Memory(memory))
                } else if binary.is_empty() {
                    (CONTENT_TEXT, Content::Memory(memory))
                } else {
                    let total = binary.iter().map(|b| b.len()).sum::<usize>();
                    let mut content = Vec::with_capacity(8 + memory.len() + total);
                    content.extend_from_slice(&readable_len.to_le_bytes());
                    content.extend_from_slice(&memory);
                    for data in binary {
                        content.extend_from_slice(data);
                    }
                    (CONTENT_WITH_BINARY, Content::Memory(Cow::Owned(content)))
                }
            };
            Ok(Encoded {
                kind: KIND_TOOL_RESULT,
                content_kind,
                flags: if output.is_error { FLAG_IS_ERROR } else { 0 },
                meta,
                content,
            })
        }
    }
}

/// The checksum of a frame's body (metadata then content).
pub(crate) fn body_crc(meta: &[u8], content: &[u8]) -> u32 {
    let mut crc = Crc32c::new();
    crc.update(meta);
    crc.update(content);
    crc.finish()
}

/// Bytes before the readable text in the content of a [`CONTENT_WITH_BINARY`] frame: the
/// readable text's length (u64).
pub(crate) const READABLE_LEN_PREFIX: u64 = 8;

/// Where a tool result's readable text lies in its frame's content: `(offset, len)`, given
/// the content's first [`READABLE_LEN_PREFIX`] bytes (or fewer when the content is shorter;
/// only read for [`CONTENT_WITH_BINARY`]).
pub(crate) fn readable_range(
    header: &FrameHeader,
    prefix: &[u8],
) -> Result<(u64, u64), RecordCorruption> {
    if header.content_kind != CONTENT_WITH_BINARY {
        return Ok((0, header.content_len));
    }
    let bytes: [u8; 8] = prefix
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .ok_or(RecordCorruption::ReadableLength)?;
    let len = u64::from_le_bytes(bytes);
    if len > header.content_len.saturating_sub(READABLE_LEN_PREFIX) {
        return Err(RecordCorruption::ReadableLength);
    }
    Ok((READABLE_LEN_PREFIX, len))
}

/// What a tool result's metadata says, for `output_info` and `content_block` without
/// reading the content.
#[derive(Debug)]
pub(crate) struct ResultSummary {
    pub(crate) call_id: ToolCallId,
    pub(crate) name: String,
    pub(crate) kind: OutputKind,
    meta: SummaryMeta,
}

impl ResultSummary {
    /// The stored token estimate, if any.
    pub(crate) fn estimate(&self) -> Option<u64> {
        self.meta.estimate
    }

    /// The remote tool the call reached, if it was stored.
    pub(crate) fn target(&self) -> Option<ToolRef> {
        self.meta.target.clone()
    }

    /// The stored count of line breaks in the readable text, if any.
    pub(crate) fn line_breaks(&self) -> Option<u64> {
        self.meta.line_breaks
    }

    /// Whether the readable text is all the result holds: no block, one plain text block,
    /// or text blocks only.
    pub(crate) fn text_only(&self) -> bool {
        self.meta.blocks.as_ref().is_none_or(|blocks| {
            blocks
                .iter()
                .all(|stored| stored.block.get("type").and_then(Value::as_str) == Some("text"))
        })
    }
}

impl ResultSummary {
    /// The blocks other than text, as a preview lists them, from the stored skeletons and
    /// bulk lengths alone (the placeholder of a block depends on nothing else).
    pub(crate) fn block_lines(&self) -> BlockLines {
        let Some(blocks) = &self.meta.blocks else {
            // One plain text block.
            return BlockLines::default();
        };
        let mut lines = BlockLines::default();
        for (i, stored) in blocks.iter().enumerate() {
            let block = ContentBlock::from_object(stored.block.clone());
            lines.has_binary |= block.binary().is_some();
            if let Some(line) = block.placeholder_sized(i, stored.len) {
                lines.placeholders.push(line);
            }
        }
        lines
    }
}

/// Reads a tool result's metadata, but for its structured content and `_meta` (see
/// [`SummaryMeta`]).
pub(crate) fn decode_summary(
    header: &FrameHeader,
    meta: &[u8],
) -> Result<ResultSummary, RecordCorruption> {
    let meta: SummaryMeta = serde_json::from_slice(meta).map_err(|_| RecordCorruption::Metadata)?;
    Ok(summary_of(header, meta))
}

fn summary_of(header: &FrameHeader, meta: SummaryMeta) -> ResultSummary {
    let kind = match header.content_kind {
        CONTENT_JSON => OutputKind::Json,
        _ => OutputKind::Text,
    };
    ResultSummary {
        call_id: meta.call_id.clone(),
        name: meta.name.clone(),
        kind,
        meta,
    }
}

/// Where the bulk of one content block lies in its frame's content, to read it alone.
#[derive(Debug)]
pub(crate) struct BlockPlace {
    skeleton: JsonObject,
    /// Offset from the content's start and length of the bulk, if the block has one.
    pub(crate) bulk: Option<(u64, u64)>,
}

impl ResultSummary {
    /// Where block `position` is, given where the readable text lies (`readable`: offset
    /// and length in the content). `Ok(None)` when there is no such block.
    pub(crate) fn place(
        &self,
        position: usize,
        readable: (u64, u64),
    ) -> Result<Option<BlockPlace>, RecordCorruption> {
        let Some(blocks) = &self.meta.blocks else {
            // One plain text block: the readable text.
            return Ok(
                (position == 0 && self.kind == OutputKind::Text).then(|| BlockPlace {
                    skeleton: JsonObject::from_iter([
                        ("type".to_owned(), Value::from("text")),
                        ("text".to_owned(), Value::from("")),
                    ]),
                    bulk: Some(readable),
                }),
            );
        };
        let Some(stored) = blocks.get(position) else {
            return Ok(None);
        };
        let bulk = match (stored.at, stored.len) {
            (Some(at), Some(len)) => {
                let base = if is_textual(&stored.block) {
                    if at.saturating_add(len) > readable.1 {
                        return Err(RecordCorruption::BlockRange);
                    }
                    readable.0
                } else {
                    readable.0 + readable.1
                };
                Some((base.saturating_add(at), len))
            }
            _ => None,
        };
        Ok(Some(BlockPlace {
            skeleton: stored.block.clone(),
            bulk,
        }))
    }
}

/// Whether a stored block's bulk is text (in the readable text) rather than binary data.
fn is_textual(skeleton: &JsonObject) -> bool {
    match skeleton.get("type").and_then(Value::as_str) {
        Some("text") => true,
        Some("resource") => skeleton
            .get("resource")
            .and_then(|r| r.get("text"))
            .is_some(),
        _ => false,
    }
}

impl BlockPlace {
    /// The block, with `bulk` (the bytes at [`BlockPlace::bulk`]) put back.
    pub(crate) fn rebuild(self, bulk: Vec<u8>) -> Result<ContentBlock, RecordCorruption> {
        let mut block = ContentBlock::from_object(self.skeleton);
        if self.bulk.is_none() {
            return Ok(block);
        }
        // Each arm takes the bytes as they are: a text is checked, never copied.
        let text = |bulk| String::from_utf8(bulk).map_err(|_| RecordCorruption::BlockText);
        match &mut block {
            ContentBlock::Text(content) => content.text = text(bulk)?,
            ContentBlock::Image(media) | ContentBlock::Audio(media) => media.data = bulk,
            ContentBlock::Resource(embedded) => match &mut embedded.resource {
                ResourceContents::Text(resource) => resource.text = text(bulk)?,
                ResourceContents::Blob(resource) => resource.blob = bulk,
            },
            _ => return Err(RecordCorruption::BlockKind),
        }
        Ok(block)
    }
}

/// Rebuilds the record from a checked frame body.
pub(crate) fn decode_record(
    header: &FrameHeader,
    meta: &[u8],
    mut content: Vec<u8>,
) -> Result<Record, RecordCorruption> {
    match header.kind {
        KIND_USER | KIND_ASSISTANT | KIND_USAGE => {
            let record: Record =
                serde_json::from_slice(meta).map_err(|_| RecordCorruption::Metadata)?;
            let expected = match header.kind {
                KIND_USER => matches!(record, Record::User(_)),
                KIND_ASSISTANT => matches!(record, Record::Assistant(_)),
                _ => matches!(record, Record::Usage(_)),
            };
            if expected {
                Ok(record)
            } else {
                Err(RecordCorruption::KindMismatch)
            }
        }
        KIND_TOOL_RESULT => {
            let full: ResultMeta =
                serde_json::from_slice(meta).map_err(|_| RecordCorruption::Metadata)?;
            let (structured, result_meta) = (full.structured, full.meta);
            let summary = summary_of(
                header,
                SummaryMeta {
                    call_id: full.call_id,
                    name: full.name,
                    target: full.target,
                    blocks: full.blocks,
                    estimate: full.estimate,
                    line_breaks: full.line_breaks,
                },
            );
            let readable = readable_range(header, &content)?;
            let mut output = ToolOutput {
                spilled: Vec::new(),
                is_error: header.flags & FLAG_IS_ERROR != 0,
                meta: result_meta,
                structured_content: structured,
                content: Vec::new(),
            };
            let text_of =
                |content: &[u8], (at, len): (u64, u64)| -> Result<Vec<u8>, RecordCorruption> {
                    let end = at.checked_add(len).ok_or(RecordCorruption::BlockRange)?;
                    content
                        .get(
                            usize::try_from(at).map_err(|_| RecordCorruption::BlockRange)?
                                ..usize::try_from(end).map_err(|_| RecordCorruption::BlockRange)?,
                        )
                        .map(<[u8]>::to_vec)
                        .ok_or(RecordCorruption::BlockRange)
                };
            if header.content_kind == CONTENT_JSON {
                if summary.meta.blocks.is_some() {
                    return Err(RecordCorruption::JsonContent);
                }
                output.structured_content = Some(
                    serde_json::from_slice::<Value>(&content)
                        .map_err(|_| RecordCorruption::JsonContent)?,
                );
            } else {
                let count = summary.meta.blocks.as_ref().map_or(1, Vec::len);
                for position in 0..count {
                    let place = summary
                        .place(position, readable)?
                        .ok_or(RecordCorruption::BlockRange)?;
                    let bulk = match place.bulk {
                        // One block that is the whole content (a text result, most often)
                        // takes the content itself: it is not held twice.
                        Some((0, len)) if count == 1 && len == content.len() as u64 => {
                            std::mem::take(&mut content)
                        }
                        Some(range) => text_of(&content, range)?,
                        None => Vec::new(),
                    };
                    output.content.push(place.rebuild(bulk)?);
                }
            }
            Ok(Record::ToolResult(ToolResult {
                target: summary.meta.target.clone(),
                call_id: summary.call_id,
                name: summary.name,
                output,
            }))
        }
        _ => Err(RecordCorruption::UnknownKind),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use psych_types::{AssistantMessage, ToolCall, UserMessage};

    fn round_trip(record: &Record) -> Record {
        let encoded = encode_record(record, None).unwrap();
        let header = FrameHeader {
            seq: 7,
            kind: encoded.kind,
            content_kind: encoded.content_kind,
            flags: encoded.flags,
            write_index: 3,
            meta_len: encoded.meta.len() as u32,
            content_len: encoded.content.len(),
        };
        let bytes = header.encode();
        assert_eq!(FrameHeader::decode(&bytes), Ok(header));
        decode_record(&header, &encoded.meta, encoded.content.bytes().to_vec()).unwrap()
    }

    /// The metadata a tool result with `index` would have (other members do not matter).
    fn index_meta(index: Option<LineIndex>) -> Vec<u8> {
        serde_json::to_vec(&ResultMeta {
            target: None,
            call_id: ToolCallId::new("c").unwrap(),
            name: "t".into(),
            blocks: None,
            structured: None,
            meta: None,
            estimate: None,
            line_breaks: Some(0),
            line_index: index,
        })
        .unwrap()
    }

    /// Checks every line's mark of `text` indexed at `stride` against counting.
    fn check_marks(text: &[u8], stride: u64) {
        let (total, index) = index_lines_by(text, stride);
        assert_eq!(total, psych_types::count_line_breaks(text));
        let len = text.len() as u64;
        assert_eq!(
            index.is_some(),
            len > stride,
            "an index exactly when longer than a stride"
        );
        let meta = index_meta(index);
        // Line n starts after the n-th break: its start, or the end for lines past it.
        let mut starts = vec![0u64];
        starts.extend(memchr::memchr_iter(b'\n', text).map(|at| at as u64 + 1));
        for line in 0..=total + 1 {
            let mark = line_mark(&meta, len, line).unwrap();
            let start = starts.get(line as usize).copied().unwrap_or(len);
            assert!(mark.at <= start && mark.at < len.max(1), "{line}: {mark:?}");
            let before = psych_types::count_line_breaks(&text[..mark.at as usize]);
            assert_eq!(mark.breaks_before, before, "{line}: {mark:?}");
            assert!(
                mark.at == 0 || mark.breaks_before < line,
                "{line}: {mark:?}"
            );
            // The last mark before the line: the line's break is before the next boundary.
            assert!(
                start <= mark.at + stride || mark.at + stride >= len,
                "{line}: {mark:?}"
            );
        }
    }

    #[test]
    fn a_line_mark_is_the_last_index_entry_before_the_line() {
        let mut text = Vec::new();
        for i in 0..300u32 {
            // Lines of 0 to 40 bytes, some runs of empty lines, and no final break.
            text.extend(std::iter::repeat_n(b'x', (i * 7 % 41) as usize));
            text.push(b'\n');
        }
        text.extend_from_slice(b"tail");
        for stride in [1, 2, 3, 7, 64, 1000, 4096, 10_000] {
            check_marks(&text, stride);
        }
        check_marks(b"", 1);
        check_marks(b"\n\n\n", 1);
        check_marks(b"no break at all", 4);
    }

    #[test]
    fn the_index_stays_within_its_bound_whatever_the_size() {
        let max_chars = 8 * (LINE_INDEX_MAX_ENTRIES - 1);
        assert_eq!(max_chars, 16_376, "the bound docs/format.md states");
        for len in [
            0u64,
            LINE_INDEX_MIN_STRIDE,
            LINE_INDEX_MIN_STRIDE + 1,
            256 << 20,
            (256 << 20) + 1,
            1 << 30,
            (1 << 40) + 12_345,
            (1 << 48) - 1,
        ] {
            let stride = line_index_stride(len);
            let entries = len.saturating_sub(1) / stride;
            assert!(stride >= LINE_INDEX_MIN_STRIDE && stride.is_power_of_two());
            assert!(entries < LINE_INDEX_MAX_ENTRIES, "{len}: {entries}");
        }
        assert_eq!(line_index_stride(256 << 20), 128 << 10);
        assert_eq!(line_index_stride((256 << 20) + 1), 256 << 10);
        // A real text past one stride: one entry per stride inside it, 8 characters each.
        let text = vec![b'\n'; 3 * LINE_INDEX_MIN_STRIDE as usize + 5];
        let (total, index) = index_lines(&text);
        let index = index.unwrap();
        assert_eq!(
            (total, index.stride),
            (text.len() as u64, LINE_INDEX_MIN_STRIDE)
        );
        assert_eq!(index.breaks.len(), 3 * 8);
        let exact = vec![b'a'; 2 * LINE_INDEX_MIN_STRIDE as usize];
        assert_eq!(index_lines(&exact).1.unwrap().breaks.len(), 8);
        let short = vec![b'a'; LINE_INDEX_MIN_STRIDE as usize];
        assert!(index_lines(&short).1.is_none());
    }

    #[test]
    fn a_result_longer_than_a_stride_stores_its_index_after_the_other_members() {
        let text = "line\n".repeat(30_000);
        let record = Record::ToolResult(ToolResult {
            target: None,
            call_id: ToolCallId::new("c").unwrap(),
            name: "t".into(),
            output: ToolOutput::text(text),
        });
        let encoded = encode_record(&record, None).unwrap();
        let meta = std::str::from_utf8(&encoded.meta).unwrap();
        // Entry 1: 131,072 bytes hold 26,214 breaks (u48 LE 66 66 00 00 00 00).
        assert_eq!(
            meta,
            r#"{"call_id":"c","name":"t","line_breaks":30000,"line_index":{"stride":131072,"breaks":"ZmYAAAAA"}}"#
        );
        assert_eq!(
            line_mark(&encoded.meta, 150_000, 29_000),
            Ok(LineMark {
                at: 131_072,
                breaks_before: 26_214
            })
        );
        // Whole records and summaries read as before: the member is not theirs.
        assert_eq!(round_trip(&record), record);
    }

    #[test]
    fn a_line_index_that_does_not_fit_its_text_is_corruption() {
        let meta = |stride: u64, breaks: &str| {
            format!(
                r#"{{"call_id":"c","name":"t","line_index":{{"stride":{stride},"breaks":"{breaks}"}}}}"#
            )
        };
        let ok = meta(4, "AQAAAAAA");
        assert_eq!(
            line_mark(ok.as_bytes(), 5, 2),
            Ok(LineMark {
                at: 4,
                breaks_before: 1
            })
        );
        for (stride, breaks, len) in [
            (4, "AQAAAAAA", 4),        // the entry at the text's end
            (0, "AQAAAAAA", 100),      // no stride
            (4, "AQAAAAA", 100),       // not whole entries
            (4, "AQAA*AAA", 100),      // not base64
            (1, "BQAAAAAA", 100),      // five breaks in one byte
            (u64::MAX, "AQAAAAAA", 1), // overflowing
        ] {
            assert_eq!(
                line_mark(meta(stride, breaks).as_bytes(), len, 9),
                Err(RecordCorruption::LineIndex),
                "{stride} {breaks} {len}"
            );
        }
        assert_eq!(
            line_mark(b"{not json", 5, 2),
            Err(RecordCorruption::Metadata)
        );
        // No index, or line 0's start: the text's start.
        assert_eq!(
            line_mark(br#"{"call_id":"c","name":"t"}"#, 1 << 30, 99),
            Ok(LineMark::START)
        );
    }

    #[test]
    fn binary_blocks_follow_the_readable_text() {
        let output = ToolOutput::from_blocks(vec![
            ContentBlock::text("ab"),
            ContentBlock::image("image/png", vec![7, 8, 9]),
        ]);
        let record = Record::ToolResult(ToolResult {
            target: None,
            call_id: ToolCallId::new("c").unwrap(),
            name: "t".into(),
            output: output.clone(),
        });
        let encoded = encode_record(&record, None).unwrap();
        assert_eq!(encoded.content_kind, CONTENT_WITH_BINARY);
        let readable = output.readable_text();
        let mut expected = (readable.len() as u64).to_le_bytes().to_vec();
        expected.extend_from_slice(readable.as_bytes());
        expected.extend_from_slice(&[7, 8, 9]);
        assert_eq!(encoded.content.bytes(), expected.as_slice());
    }

    #[test]
    fn every_record_shape_round_trips() {
        let call_id = ToolCallId::new("call_1").unwrap();
        let records = [
            Record::User(UserMessage { text: "hi".into() }),
            Record::Assistant(AssistantMessage {
                text: String::new(),
                tool_calls: vec![ToolCall {
                    id: call_id.clone(),
                    name: "fs.read".into(),
                    arguments: serde_json::json!({"path": "/tmp"}),
                }],
            }),
            Record::ToolResult(ToolResult {
                target: None,
                call_id: call_id.clone(),
                name: "t".into(),
                output: ToolOutput::error("boom"),
            }),
            Record::ToolResult(ToolResult {
                target: None,
                call_id: call_id.clone(),
                name: "t".into(),
                output: ToolOutput::json(
                    serde_json::json!({"b": [1.5, 0.1, 1e300, -2.9192428983567626e-228, 1.0866854612579071e-130], "a": null}),
                ),
            }),
            Record::ToolResult(ToolResult {
                target: None,
                call_id: call_id.clone(),
                name: "t".into(),
                output: ToolOutput::from_blocks(vec![
                    ContentBlock::text("see:"),
                    ContentBlock::image("image/png", vec![0, 159, 146, 150]),
                    ContentBlock::from_object(
                        serde_json::json!({"type": "resource", "resource": {"uri": "file:///a", "text": "é"}})
                            .as_object()
                            .cloned()
                            .unwrap(),
                    ),
                    ContentBlock::audio("audio/wav", vec![1, 2]),
                    ContentBlock::from_object(
                        serde_json::json!({"type": "x-video", "n": 1}).as_object().cloned().unwrap(),
                    ),
                ])
                .with_structured_content(serde_json::json!({"k": 1})),
            }),
            Record::ToolResult(ToolResult {
                target: None,
                call_id,
                name: "t".into(),
                output: ToolOutput::default(),
            }),
            Record::Usage(psych_types::Usage {
                input: 1_200,
                cache_read: 30_000,
                cache_write: 0,
                output: 87,
            }),
        ];
        for record in &records {
            assert_eq!(&round_trip(record), record);
        }
    }

    #[test]
    fn a_usage_record_is_kind_4_and_its_kind_byte_is_checked() {
        let usage = Record::Usage(psych_types::Usage {
            input: 5,
            output: 2,
            ..psych_types::Usage::default()
        });
        let encoded = encode_record(&usage, None).unwrap();
        assert_eq!(
            (encoded.kind, encoded.content_kind, encoded.flags),
            (KIND_USAGE, CONTENT_NONE, 0)
        );
        let header = |kind| FrameHeader {
            seq: 0,
            kind,
            content_kind: CONTENT_NONE,
            flags: 0,
            write_index: 0,
            meta_len: u32::try_from(encoded.meta.len()).unwrap(),
            content_len: 0,
        };
        assert_eq!(
            decode_record(&header(KIND_USAGE), &encoded.meta, Vec::new()),
            Ok(usage.clone())
        );
        assert_eq!(
            decode_record(&header(KIND_USER), &encoded.meta, Vec::new()),
            Err(RecordCorruption::KindMismatch)
        );
        assert!(FrameHeader::decode(&header(KIND_USAGE).encode()).is_ok());
        assert!(FrameHeader::decode(&header(KIND_USAGE + 1).encode()).is_err());
    }

    #[test]
    fn content_is_the_readable_bytes() {
        let record = Record::ToolResult(ToolResult {
            target: None,
            call_id: ToolCallId::new("c").unwrap(),
            name: "t".into(),
            output: ToolOutput::json(serde_json::json!({"k": [1, 2]})),
        });
        let Record::ToolResult(result) = &record else {
            unreachable!()
        };
        let encoded = encode_record(&record, None).unwrap();
        assert_eq!(
            encoded.content.bytes(),
            &*psych_types::readable_bytes(&result.output)
        );
    }

    #[test]
    fn damaged_frame_headers_are_named() {
        let header = FrameHeader {
            seq: 1,
            kind: KIND_USER,
            content_kind: CONTENT_NONE,
            flags: 0,
            write_index: 0,
            meta_len: 10,
            content_len: 0,
        };
        let good = header.encode();
        let mut bad = good;
        bad[0] = b'X';
        assert_eq!(FrameHeader::decode(&bad), Err(FrameDamage::NoMagic));
        let mut bad = good;
        bad[5] ^= 1;
        assert_eq!(FrameHeader::decode(&bad), Err(FrameDamage::HeaderChecksum));
        let undefined = FrameHeader { kind: 9, ..header }.encode();
        assert_eq!(
            FrameHeader::decode(&undefined),
            Err(FrameDamage::UndefinedFields)
        );
    }

    #[test]
    fn byte_15_is_the_write_index_capped_at_255() {
        assert_eq!(
            [0, 1, 254, 255, 256, 100_000].map(write_index),
            [0, 1, 254, 255, 255, 255]
        );
        for index in [0, 7, MAX_WRITE_INDEX] {
            let header = FrameHeader {
                seq: 9,
                kind: KIND_USER,
                content_kind: CONTENT_NONE,
                flags: 0,
                write_index: index,
                meta_len: 3,
                content_len: 0,
            };
            let bytes = header.encode();
            assert_eq!(bytes[15], index);
            assert_eq!(FrameHeader::decode(&bytes), Ok(header));
            // Covered by the header checksum.
            let mut other = bytes;
            other[15] ^= 1;
            assert_eq!(
                FrameHeader::decode(&other),
                Err(FrameDamage::HeaderChecksum)
            );
        }
    }

    #[test]
    fn header_faults_are_told_apart() {
        let a = file_header(&RunId::new("a").unwrap());
        let b = file_header(&RunId::new("bb").unwrap());
        assert_eq!(header_fault(&b), HeaderFault::OtherRun("bb".into()));
        assert_eq!(
            header_fault(b"hello world, not a log"),
            HeaderFault::NotALog
        );
        let mut damaged = a.clone();
        damaged[12] ^= 0x20;
        assert_eq!(header_fault(&damaged), HeaderFault::Damaged);
        let next = FORMAT_VERSION + 1;
        let mut newer = a[..FILE_HEADER_FIXED + 1].to_vec();
        newer[8..10].copy_from_slice(&next.to_le_bytes());
        let crc = crc32c(&newer);
        newer.extend_from_slice(&crc.to_le_bytes());
        assert_eq!(header_fault(&newer), HeaderFault::Version(next));
    }
}
