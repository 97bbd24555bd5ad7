//! The on-disk format, byte by byte (documented in `docs/format.md`): the file header, the
//! frame header, and how a [`Record`] splits into a metadata part and a content part.
//!
//! Everything here is pure: bytes in, values out. Integers are little-endian.

use psych_types::{
    OutputBody, OutputKind, Record, RunId, ToolCallId, ToolOutput, ToolResult, readable_bytes,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::crc32c::{Crc32c, crc32c};

/// The first eight bytes of every log file.
pub(crate) const FILE_MAGIC: [u8; 8] = *b"PSYCHLOG";
/// The format version written in the file header.
pub(crate) const FORMAT_VERSION: u16 = 2;
/// Bytes of the file header before the Run id: magic, version, Run id length.
pub(crate) const FILE_HEADER_FIXED: usize = 12;
/// The first four bytes of every frame.
pub(crate) const FRAME_MAGIC: [u8; 4] = *b"PSRF";
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

/// Content kind byte: no content (user and assistant records).
pub(crate) const CONTENT_NONE: u8 = 0;
/// Content kind byte: UTF-8 text.
pub(crate) const CONTENT_TEXT: u8 = 1;
/// Content kind byte: JSON, stored as its pretty text view.
pub(crate) const CONTENT_JSON: u8 = 2;
/// Content kind byte: binary.
pub(crate) const CONTENT_BINARY: u8 = 3;

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

/// The file header for `run` followed by both slots of the high-water mark of an empty log:
/// what a new file starts with.
pub(crate) fn initial_file_start(run: &RunId) -> Vec<u8> {
    let mut out = file_header(run);
    let frames_start = (out.len() + MARK_SLOTS * MARK_LEN) as u64;
    let mark = Mark::initial(frames_start).encode();
    for _ in 0..MARK_SLOTS {
        out.extend_from_slice(&mark);
    }
    out
}

/// The high-water mark: what the last sync of the log made durable, so that `open` can tell
/// frames lost after they were synced from a write a crash cut short (`docs/format.md`,
/// "High-water mark"). Each sync that follows new frames writes one, into slot
/// `generation % 2`, before its `fdatasync`.
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

/// Why 32 bytes are not a frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FrameFault {
    /// The bytes do not start with [`FRAME_MAGIC`].
    Magic,
    /// The header checksum does not match.
    HeaderChecksum,
    /// The checksum matches but a kind or flag byte holds a value this version does not
    /// define.
    Fields,
}

impl FrameFault {
    pub(crate) fn describe(self) -> &'static str {
        match self {
            FrameFault::Magic => "no frame magic",
            FrameFault::HeaderChecksum => "frame header checksum mismatch",
            FrameFault::Fields => "frame header holds undefined kind or flag values",
        }
    }
}

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
        out[12] = self.kind;
        out[13] = self.content_kind;
        out[14] = self.flags;
        out[15] = self.write_index;
        out[16..20].copy_from_slice(&self.meta_len.to_le_bytes());
        out[20..28].copy_from_slice(&self.content_len.to_le_bytes());
        let crc = crc32c(&out[0..28]);
        out[28..32].copy_from_slice(&crc.to_le_bytes());
        out
    }

    /// Parses and checks 32 header bytes.
    pub(crate) fn decode(bytes: &[u8; FRAME_HEADER_LEN]) -> Result<Self, FrameFault> {
        if bytes[0..4] != FRAME_MAGIC {
            return Err(FrameFault::Magic);
        }
        let stored = u32::from_le_bytes([bytes[28], bytes[29], bytes[30], bytes[31]]);
        if crc32c(&bytes[0..28]) != stored {
            return Err(FrameFault::HeaderChecksum);
        }
        let mut seq = [0u8; 8];
        seq.copy_from_slice(&bytes[4..12]);
        let mut content_len = [0u8; 8];
        content_len.copy_from_slice(&bytes[20..28]);
        let header = Self {
            seq: u64::from_le_bytes(seq),
            kind: bytes[12],
            content_kind: bytes[13],
            flags: bytes[14],
            write_index: bytes[15],
            meta_len: u32::from_le_bytes([bytes[16], bytes[17], bytes[18], bytes[19]]),
            content_len: u64::from_le_bytes(content_len),
        };
        let known = match header.kind {
            KIND_USER | KIND_ASSISTANT => {
                header.content_kind == CONTENT_NONE && header.content_len == 0 && header.flags == 0
            }
            KIND_TOOL_RESULT => {
                (CONTENT_TEXT..=CONTENT_BINARY).contains(&header.content_kind)
                    && header.flags & !FLAG_IS_ERROR == 0
            }
            _ => false,
        };
        if !known {
            return Err(FrameFault::Fields);
        }
        Ok(header)
    }
}

/// The metadata of a tool result: everything but the content.
#[derive(Debug, Serialize, Deserialize)]
struct ResultMeta {
    call_id: ToolCallId,
    name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mime_type: Option<String>,
}

/// A record split for storage: header fields, metadata and the readable content.
#[derive(Debug)]
pub(crate) struct Encoded<'a> {
    pub(crate) kind: u8,
    pub(crate) content_kind: u8,
    pub(crate) flags: u8,
    pub(crate) meta: Vec<u8>,
    pub(crate) content: std::borrow::Cow<'a, [u8]>,
}

/// Splits `record` into metadata and content.
pub(crate) fn encode_record(record: &Record) -> Result<Encoded<'_>, serde_json::Error> {
    use std::borrow::Cow;
    match record {
        Record::User(_) | Record::Assistant(_) => Ok(Encoded {
            kind: if matches!(record, Record::User(_)) {
                KIND_USER
            } else {
                KIND_ASSISTANT
            },
            content_kind: CONTENT_NONE,
            flags: 0,
            meta: serde_json::to_vec(record)?,
            content: Cow::Borrowed(&[]),
        }),
        Record::ToolResult(result) => {
            // JSON is stored only as its text view and parsed back on read: exact because
            // serde_json writes the shortest round-tripping float and this crate turns on
            // its `float_roundtrip` parsing.
            let content = readable_bytes(&result.output);
            let (content_kind, mime_type) = match &result.output.body {
                OutputBody::Text { .. } => (CONTENT_TEXT, None),
                OutputBody::Json { .. } => (CONTENT_JSON, None),
                OutputBody::Binary { mime_type, .. } => (CONTENT_BINARY, Some(mime_type.clone())),
            };
            let meta = serde_json::to_vec(&ResultMeta {
                call_id: result.call_id.clone(),
                name: result.name.clone(),
                mime_type,
            })?;
            Ok(Encoded {
                kind: KIND_TOOL_RESULT,
                content_kind,
                flags: if result.output.is_error {
                    FLAG_IS_ERROR
                } else {
                    0
                },
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

/// What a tool result's metadata says, for `output_info` without reading the content.
#[derive(Debug)]
pub(crate) struct ResultSummary {
    pub(crate) call_id: ToolCallId,
    pub(crate) name: String,
    pub(crate) kind: OutputKind,
}

/// Reads a tool result's metadata.
pub(crate) fn decode_summary(
    header: &FrameHeader,
    meta: &[u8],
) -> Result<ResultSummary, &'static str> {
    let meta: ResultMeta =
        serde_json::from_slice(meta).map_err(|_| "tool result metadata is not valid")?;
    let kind = match (header.content_kind, meta.mime_type) {
        (CONTENT_TEXT, None) => OutputKind::Text,
        (CONTENT_JSON, None) => OutputKind::Json,
        (CONTENT_BINARY, Some(mime_type)) => OutputKind::Binary { mime_type },
        _ => return Err("tool result metadata does not match its content kind"),
    };
    Ok(ResultSummary {
        call_id: meta.call_id,
        name: meta.name,
        kind,
    })
}

/// Rebuilds the record from a checked frame body.
pub(crate) fn decode_record(
    header: &FrameHeader,
    meta: &[u8],
    content: Vec<u8>,
) -> Result<Record, &'static str> {
    match header.kind {
        KIND_USER | KIND_ASSISTANT => {
            let record: Record =
                serde_json::from_slice(meta).map_err(|_| "record metadata is not valid")?;
            let expected = if header.kind == KIND_USER {
                matches!(record, Record::User(_))
            } else {
                matches!(record, Record::Assistant(_))
            };
            if expected {
                Ok(record)
            } else {
                Err("record metadata does not match its kind byte")
            }
        }
        KIND_TOOL_RESULT => {
            let meta: ResultMeta =
                serde_json::from_slice(meta).map_err(|_| "tool result metadata is not valid")?;
            let body = match (header.content_kind, meta.mime_type) {
                (CONTENT_TEXT, None) => OutputBody::Text {
                    text: String::from_utf8(content).map_err(|_| "text content is not UTF-8")?,
                },
                (CONTENT_JSON, None) => OutputBody::Json {
                    value: serde_json::from_slice::<Value>(&content)
                        .map_err(|_| "JSON content does not parse")?,
                },
                (CONTENT_BINARY, Some(mime_type)) => OutputBody::Binary {
                    mime_type,
                    data: content,
                },
                _ => return Err("tool result metadata does not match its content kind"),
            };
            Ok(Record::ToolResult(ToolResult {
                call_id: meta.call_id,
                name: meta.name,
                output: ToolOutput {
                    body,
                    is_error: header.flags & FLAG_IS_ERROR != 0,
                },
            }))
        }
        _ => Err("undefined record kind"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use psych_types::{AssistantMessage, ToolCall, UserMessage};

    fn round_trip(record: &Record) -> Record {
        let encoded = encode_record(record).unwrap();
        let header = FrameHeader {
            seq: 7,
            kind: encoded.kind,
            content_kind: encoded.content_kind,
            flags: encoded.flags,
            write_index: 3,
            meta_len: encoded.meta.len() as u32,
            content_len: encoded.content.len() as u64,
        };
        let bytes = header.encode();
        assert_eq!(FrameHeader::decode(&bytes), Ok(header));
        decode_record(&header, &encoded.meta, encoded.content.into_owned()).unwrap()
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
                call_id: call_id.clone(),
                name: "t".into(),
                output: ToolOutput::error("boom"),
            }),
            Record::ToolResult(ToolResult {
                call_id: call_id.clone(),
                name: "t".into(),
                output: ToolOutput::json(
                    serde_json::json!({"b": [1.5, 0.1, 1e300, -2.9192428983567626e-228, 1.0866854612579071e-130], "a": null}),
                ),
            }),
            Record::ToolResult(ToolResult {
                call_id,
                name: "t".into(),
                output: ToolOutput::binary("image/png", vec![0, 159, 146, 150]),
            }),
        ];
        for record in &records {
            assert_eq!(&round_trip(record), record);
        }
    }

    #[test]
    fn content_is_the_readable_bytes() {
        let record = Record::ToolResult(ToolResult {
            call_id: ToolCallId::new("c").unwrap(),
            name: "t".into(),
            output: ToolOutput::json(serde_json::json!({"k": [1, 2]})),
        });
        let Record::ToolResult(result) = &record else {
            unreachable!()
        };
        let encoded = encode_record(&record).unwrap();
        assert_eq!(
            encoded.content.as_ref(),
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
        assert_eq!(FrameHeader::decode(&bad), Err(FrameFault::Magic));
        let mut bad = good;
        bad[5] ^= 1;
        assert_eq!(FrameHeader::decode(&bad), Err(FrameFault::HeaderChecksum));
        let undefined = FrameHeader { kind: 9, ..header }.encode();
        assert_eq!(FrameHeader::decode(&undefined), Err(FrameFault::Fields));
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
            assert_eq!(FrameHeader::decode(&other), Err(FrameFault::HeaderChecksum));
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
