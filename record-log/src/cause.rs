//! Why a frame, a tail or a record is damaged: the causes carried by [`TailLoss`],
//! [`OpenError::Corrupt`] and [`ReadError::Corrupt`], as enums to match on. Each one's
//! `Display` is the sentence the log has always printed for it.
//!
//! [`TailLoss`]: crate::TailLoss
//! [`OpenError::Corrupt`]: crate::OpenError::Corrupt
//! [`ReadError::Corrupt`]: crate::ReadError::Corrupt

use std::fmt;

/// What is wrong with one frame where open's scan stopped (`docs/format.md`, "Recovery on
/// open").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FrameDamage {
    /// Fewer bytes are left in the file than a frame header takes.
    IncompleteHeader,
    /// The bytes where a frame belongs do not start with the frame magic.
    NoMagic,
    /// The frame header's checksum does not match.
    HeaderChecksum,
    /// The header checks out but holds a kind or flag value this version does not define.
    UndefinedFields,
    /// The header holds another record's position than the one due there.
    OutOfPlace {
        /// The position the frame holds.
        found: u64,
        /// The position due at that place.
        expected: u64,
    },
    /// The header is whole but says the frame runs past the end of the file.
    CutShort,
    /// The frame body's checksum does not match.
    BodyChecksum,
}

impl fmt::Display for FrameDamage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameDamage::IncompleteHeader => f.write_str("incomplete frame header"),
            FrameDamage::NoMagic => f.write_str("no frame magic"),
            FrameDamage::HeaderChecksum => f.write_str("frame header checksum mismatch"),
            FrameDamage::UndefinedFields => {
                f.write_str("frame header holds undefined kind or flag values")
            }
            FrameDamage::OutOfPlace { found, expected } => {
                write!(f, "frame holds record {found} where {expected} belongs")
            }
            FrameDamage::CutShort => f.write_str("frame cut short"),
            FrameDamage::BodyChecksum => f.write_str("frame body checksum mismatch"),
        }
    }
}

/// Why a tail was cut off on open (or, read-only, found and left in place): the cause in a
/// [`TailLoss`](crate::TailLoss).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TailReason {
    /// The file's creation was cut short before its header was whole; no record had been
    /// written.
    HeaderTorn,
    /// A damaged frame with no whole frame after it: a write torn by a crash (the process
    /// died mid-append) or damage at the end of the file.
    Damaged {
        /// What is wrong with the frame.
        damage: FrameDamage,
        /// When records of the last sync are among those cut: the last of them (the last
        /// sync wrote records up to this position, and its `fdatasync` never returned).
        last_synced: Option<u64>,
    },
    /// The last write from its first damaged frame on: a power loss left that write's
    /// pages on disk out of order, so whole frames of the same write follow the damage. None
    /// of them was ever acknowledged.
    TornWrite {
        /// The first record of the write that was cut (the damaged one).
        first: u64,
        /// The last record of that write.
        last: u64,
        /// What is wrong with the first damaged frame.
        damage: FrameDamage,
        /// Where that frame starts.
        damaged_at: u64,
        /// Where the whole frames of the same write resume.
        whole_from: u64,
        /// As in [`TailReason::Damaged`].
        last_synced: Option<u64>,
    },
    /// Zeros (or nothing) where the frames of the last sync belong: a crash before that
    /// sync returned, or frames lost after it, which the log cannot tell apart.
    LastWriteMissing {
        /// The first record of the last sync that is not in the file.
        first: u64,
        /// The last record that sync wrote.
        last: u64,
        /// Where the missing frames would start.
        at: u64,
        /// Whether the file ends there (`true`) or holds zeros from there on (`false`).
        file_ends: bool,
    },
    /// The end mark is not after the last whole frame: zeros or the end of the file where
    /// the last write left it. Frames after that one may have been lost (zeroed or cut
    /// off since they were written, or a crash before their sync returned); which, the log
    /// cannot tell, so it says so rather than take the zeros for free space. A writable
    /// open writes the end mark there again, so this is reported once.
    EndMarkMissing {
        /// Where the last whole frame ends (where the end mark belongs).
        at: u64,
        /// Whether the file ends there (`true`) or holds zeros from there on (`false`).
        file_ends: bool,
    },
}

impl fmt::Display for TailReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let synced = |f: &mut fmt::Formatter<'_>, last: &Option<u64>| match last {
            Some(last) => write!(f, "; the last sync wrote records up to {last}"),
            None => Ok(()),
        };
        match self {
            TailReason::HeaderTorn => f.write_str("file header torn during creation"),
            TailReason::Damaged {
                damage,
                last_synced,
            } => {
                write!(f, "{damage}")?;
                synced(f, last_synced)
            }
            TailReason::TornWrite {
                first,
                last,
                damage,
                damaged_at,
                whole_from,
                last_synced,
            } => {
                write!(
                    f,
                    "torn write: records {first}..={last} of the last write were not all on \
                     disk ({damage} at byte {damaged_at}; whole frames of the same write \
                     follow from byte {whole_from})"
                )?;
                synced(f, last_synced)
            }
            TailReason::LastWriteMissing {
                first,
                last,
                at,
                file_ends,
            } => write!(
                f,
                "last write missing: records {first}..={last} of the last sync are not in the \
                 file ({} from byte {at}): a crash before that sync returned, or lost since",
                if *file_ends { "it ends" } else { "zeros" }
            ),
            TailReason::EndMarkMissing { at, file_ends } => write!(
                f,
                "the log's end mark is missing: records after byte {at} may have been lost \
                 ({} from there)",
                if *file_ends { "the file ends" } else { "zeros" }
            ),
        }
    }
}

/// What follows the last whole frame, as [`LogCorruption::DurableMissing`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AfterFrames {
    /// The file ends there.
    End,
    /// Zeros from there to the end of the file.
    Zeros,
    /// Damage, as it would have been reported had nothing durable been missing.
    Damage(Box<TailReason>),
}

impl fmt::Display for AfterFrames {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AfterFrames::End => f.write_str("the file ends there"),
            AfterFrames::Zeros => f.write_str("zeros from there to the end of the file"),
            AfterFrames::Damage(reason) => write!(f, "{reason}"),
        }
    }
}

/// Why a log could not be opened as it is: the cause in
/// [`OpenError::Corrupt`](crate::OpenError::Corrupt). Opening leaves the file untouched.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LogCorruption {
    /// The file header's magic and version are right but its checksum does not match.
    HeaderChecksum,
    /// Neither slot of the high-water mark checks out, so whether records that were made
    /// durable are missing cannot be told.
    MarkDamaged,
    /// The file ends inside the high-water mark.
    MarkCut,
    /// A damaged frame is followed by a whole frame that is not the rest of a torn last
    /// write: cutting there could drop acknowledged records.
    DamageBeforeWholeFrame {
        /// What is wrong with the damaged frame.
        damage: FrameDamage,
        /// Where the whole frame after it starts.
        whole_at: u64,
    },
    /// Records that the high-water mark says a completed sync made durable are not in the
    /// file (zeroed or cut since).
    DurableMissing {
        /// The first missing record.
        first: u64,
        /// How many records the mark counts durable (the last missing one is this minus 1).
        durable_records: u64,
        /// Where the mark says the durable records end.
        durable_end: u64,
        /// What the file holds where the first missing record belongs.
        after: AfterFrames,
    },
    /// The high-water mark says its durable records end elsewhere than they do.
    MarkMismatch {
        /// How many records the mark counts durable.
        durable_records: u64,
        /// Where the mark says they end.
        mark_end: u64,
        /// Where they end in the file.
        actual_end: u64,
    },
}

impl fmt::Display for LogCorruption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LogCorruption::HeaderChecksum => f.write_str("file header checksum mismatch"),
            LogCorruption::MarkDamaged => f.write_str(
                "high-water mark damaged: neither of its slots checks out, so whether records \
                 that were made durable are missing cannot be told",
            ),
            LogCorruption::MarkCut => f.write_str("the file ends inside the high-water mark"),
            LogCorruption::DamageBeforeWholeFrame { damage, whole_at } => {
                write!(f, "{damage}; a whole frame follows at byte {whole_at}")
            }
            LogCorruption::DurableMissing {
                first,
                durable_records,
                durable_end,
                after,
            } => write!(
                f,
                "records {first}..={} were made durable but are missing (the high-water mark \
                 counts {durable_records} durable records, ending at byte {durable_end}); \
                 {after}",
                durable_records.saturating_sub(1)
            ),
            LogCorruption::MarkMismatch {
                durable_records,
                mark_end,
                actual_end,
            } => write!(
                f,
                "the high-water mark says its {durable_records} durable records end at byte \
                 {mark_end}, but they end at byte {actual_end}"
            ),
        }
    }
}

/// Why a record read by handle does not check out: the cause in
/// [`ReadError::Corrupt`](crate::ReadError::Corrupt). The file changed on disk after the
/// log was opened (every frame was checked then, or by an earlier open for a checkpoint).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecordCorruption {
    /// The frame body's checksum does not match.
    BodyChecksum,
    /// The frame header differs from the one checked on open.
    HeaderChanged,
    /// A read-only view's frame was replaced on disk since its open: the body checksum
    /// there is no longer the one the open checked (a writer cut the frame back, its sync
    /// failed, and wrote another record in its place; or the checksum's bytes were
    /// damaged since), or the file now ends before it.
    Replaced,
    /// The frame, or one block of it, is larger than this machine's memory can address.
    TooLarge,
    /// The record's metadata does not decode.
    Metadata,
    /// The metadata decodes to another kind of record than the frame's kind byte names.
    KindMismatch,
    /// The frame's kind byte names no kind of record.
    UnknownKind,
    /// A result with binary data is shorter than the length of its readable text.
    ReadableLength,
    /// A stored block's range runs past the content or the readable text, or is missing.
    BlockRange,
    /// A stored text block is not UTF-8.
    BlockText,
    /// A stored block names bytes that its kind does not take.
    BlockKind,
    /// A JSON result holds content blocks, or its content does not parse.
    JsonContent,
    /// The index names the record but its frame does not read back.
    Vanished,
    /// A tool result's line index (its metadata's `line_index`) does not fit its
    /// readable text: an entry past the text, or more line breaks than bytes before one.
    LineIndex,
}

impl fmt::Display for RecordCorruption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RecordCorruption::BodyChecksum => "frame body checksum mismatch",
            RecordCorruption::HeaderChanged => "frame header changed on disk",
            RecordCorruption::Replaced => "frame replaced on disk since the log was opened",
            RecordCorruption::TooLarge => "frame larger than memory",
            RecordCorruption::Metadata => "record metadata is not valid",
            RecordCorruption::KindMismatch => "record metadata does not match its kind byte",
            RecordCorruption::UnknownKind => "undefined record kind",
            RecordCorruption::ReadableLength => "readable text length runs past the content",
            RecordCorruption::BlockRange => "block range runs past the content",
            RecordCorruption::BlockText => "block text is not UTF-8",
            RecordCorruption::BlockKind => "stored block does not take the bytes it names",
            RecordCorruption::JsonContent => "JSON content does not parse",
            RecordCorruption::Vanished => "record is indexed but does not read back",
            RecordCorruption::LineIndex => "line index does not fit the readable text",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_texts_are_the_ones_callers_have_seen() {
        let damage = FrameDamage::BodyChecksum;
        let torn = TailReason::TornWrite {
            first: 3,
            last: 5,
            damage,
            damaged_at: 100,
            whole_from: 180,
            last_synced: Some(5),
        };
        assert_eq!(
            torn.to_string(),
            "torn write: records 3..=5 of the last write were not all on disk (frame body \
             checksum mismatch at byte 100; whole frames of the same write follow from byte \
             180); the last sync wrote records up to 5"
        );
        let missing = LogCorruption::DurableMissing {
            first: 4,
            durable_records: 6,
            durable_end: 900,
            after: AfterFrames::Zeros,
        };
        assert_eq!(
            missing.to_string(),
            "records 4..=5 were made durable but are missing (the high-water mark counts 6 \
             durable records, ending at byte 900); zeros from there to the end of the file"
        );
        assert_eq!(
            FrameDamage::OutOfPlace {
                found: 9,
                expected: 2
            }
            .to_string(),
            "frame holds record 9 where 2 belongs"
        );
    }
}
