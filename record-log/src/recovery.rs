//! Recovery on open: the file header and high-water mark, the checkpoint, the scan that
//! checks every frame, and the decision between a torn tail (cut and reported in a
//! [`Recovery`]) and damage that is not one ([`OpenError::Corrupt`]). Written down in
//! `docs/format.md`, "Recovery on open".

use std::fmt;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;

use crate::cause::{AfterFrames, FrameDamage, LogCorruption, TailReason};
use crate::checkpoint::{self, CHECKPOINT_AFTER, Identity};
use crate::crc32c::Crc32c;
use crate::error::OpenError;
use crate::format::{
    self, END_MARK_LEN, EndMark, FRAME_HEADER_LEN, FRAME_MAGIC, FRAME_TRAILER_LEN, FrameHeader,
    HeaderFault, MARK_LEN, MARK_SLOTS, Mark,
};
use crate::log::{Entry, RecordLog, open_io};

/// Read size when scanning and checksumming on open.
const SCAN_CHUNK: usize = 1 << 20;

/// A bad frame's damage, and where whole frames may start after it, if anywhere.
type Fault = (FrameDamage, Option<u64>);

/// What opening a log found and repaired. Opening never drops data silently: anything cut
/// off is described here, and records that the file's high-water mark says a completed sync
/// made durable but that are missing make `open` fail with [`OpenError::Corrupt`] instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovery {
    /// Whole records in the log after opening.
    pub records: u64,
    /// The torn or damaged tail that was cut off, or the last sync's records found
    /// missing, if any.
    pub tail: Option<TailLoss>,
}

impl Recovery {
    /// Whether the log opened with nothing cut off and no record found missing.
    pub fn is_clean(&self) -> bool {
        self.tail.is_none()
    }
}

impl fmt::Display for Recovery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} whole records", self.records)?;
        if let Some(tail) = &self.tail {
            write!(
                f,
                "; cut {} bytes of damaged tail at byte {} ({tail})",
                tail.bytes, tail.offset
            )?;
        }
        Ok(())
    }
}

/// A tail that was cut off on open: the bytes of a frame whose write was torn (the process
/// died mid-append) or damaged, with no whole frame after it ([`TailReason::Damaged`]); or
/// the part of the last write from its first damaged frame on, when a power loss left that
/// unsynced write's pages on disk out of order (whole frames of the same write after the
/// damage, none of them ever acknowledged: [`TailReason::TornWrite`]); or zeros (or
/// nothing) where the frames of the last sync belong ([`TailReason::LastWriteMissing`]), or
/// where the end mark belongs ([`TailReason::EndMarkMissing`]): a crash before that sync
/// returned, or frames lost after it, which the log cannot tell apart, so it says so
/// rather than taking the zeros for free space. When the last sync's
/// records are among those cut, the reason names them. Its `Display` is the reason in
/// words, with what was done about it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TailLoss {
    /// Byte offset the file was cut back to: the end of the last whole record.
    pub offset: u64,
    /// How many bytes were cut off.
    pub bytes: u64,
    /// What was wrong with the first bad frame.
    pub reason: TailReason,
    /// Whether the tail was left in place instead of cut: the log was opened with
    /// [`RecordLog::open_read_only`].
    pub left_in_place: bool,
}

impl fmt::Display for TailLoss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.reason)?;
        if self.left_in_place {
            f.write_str("; left in place: opened read-only")
        } else if self.reason == TailReason::HeaderTorn {
            f.write_str("; rewritten")
        } else {
            Ok(())
        }
    }
}

impl RecordLog {
    /// Scans the frames (unless the header check already reported a loss) and records
    /// what opening found.
    pub(crate) fn finish_open(
        mut self,
        header_loss: Option<TailLoss>,
    ) -> Result<(Self, Recovery), OpenError> {
        let tail = match header_loss {
            Some(loss) => Some(loss),
            None => {
                let covered = self.load_checkpoint()?;
                let tail = self.scan()?;
                if !self.read_only && self.end.saturating_sub(covered) >= CHECKPOINT_AFTER {
                    // Best effort: a checkpoint is a cache, and without one the next open
                    // verifies every frame, as it would have. It vouches for frames on
                    // disk: under a policy that does not sync, the scan may have read them
                    // from the page cache only (a power loss could still lose some while
                    // the checkpoint and the last frame survive), so they are synced first.
                    let synced = self.sync.syncs() || self.storage.sync_data(&self.file).is_ok();
                    if synced {
                        let _ = self.write_checkpoint();
                    }
                }
                tail
            }
        };
        self.recovery = Recovery {
            records: self.index.len() as u64,
            tail,
        };
        self.opened = true;
        let recovery = self.recovery.clone();
        Ok((self, recovery))
    }

    /// Checks the file header and reads the high-water mark; writes both when the file is
    /// new or its creation was torn. Returns the loss to report, and whether the header was
    /// written.
    pub(crate) fn check_header(&mut self) -> Result<(Option<TailLoss>, bool), OpenError> {
        let header = format::file_header(&self.run);
        let initial = format::initial_file_start(&self.run);
        let len = self.file_len()?;
        let want = initial.len() as u64;
        // The header and the high-water mark: where the frames (or the end mark) start.
        let frames_start = (header.len() + MARK_SLOTS * MARK_LEN) as u64;
        let mut head = vec![0u8; len.min(want) as usize];
        self.file
            .read_exact_at(&mut head, 0)
            .map_err(open_io(&self.path))?;
        self.marks_at = header.len() as u64;
        let creation_torn = len < want && initial.starts_with(&head);
        if len >= frames_start && head.starts_with(&header) && !creation_torn {
            let Some(mark) = Mark::newest(&head[header.len()..frames_start as usize]) else {
                return Err(OpenError::Corrupt {
                    path: self.path.clone(),
                    offset: self.marks_at,
                    reason: LogCorruption::MarkDamaged,
                });
            };
            self.end = frames_start;
            self.allocated = len;
            self.set_mark(mark);
            return Ok((None, false));
        }
        if creation_torn {
            // A new file, or one whose creation was cut short (or, read-only, is under way)
            // before any record: written whole, unless read-only (then nothing is rewritten).
            let rewrite = !self.read_only;
            if rewrite {
                self.storage
                    .set_len(&self.file, 0)
                    .map_err(open_io(&self.path))?;
                self.storage
                    .write_all_at(&self.file, &initial, 0)
                    .map_err(open_io(&self.path))?;
                self.storage
                    .sync_data(&self.file)
                    .map_err(open_io(&self.path))?;
            }
            // The frames start after the high-water mark; the new file's end mark is there.
            self.end = if rewrite {
                frames_start
            } else {
                len.min(frames_start)
            };
            self.allocated = if rewrite { want } else { len };
            self.set_mark(Mark::initial(frames_start));
            let loss = (len > 0).then_some(TailLoss {
                offset: 0,
                bytes: len,
                reason: TailReason::HeaderTorn,
                left_in_place: self.read_only,
            });
            return Ok((loss, rewrite));
        }
        if head.starts_with(&header) {
            return Err(OpenError::Corrupt {
                path: self.path.clone(),
                offset: self.marks_at,
                reason: LogCorruption::MarkCut,
            });
        }
        // Not our header: read enough to say why (the longest possible header).
        let mut bytes = vec![0u8; len.min(format::FILE_HEADER_FIXED as u64 + 0xFFFF + 4) as usize];
        self.file
            .read_exact_at(&mut bytes, 0)
            .map_err(open_io(&self.path))?;
        let path = self.path.clone();
        Err(match format::header_fault(&bytes) {
            HeaderFault::NotALog => OpenError::NotALog { path },
            HeaderFault::Version(version) => OpenError::UnsupportedVersion { path, version },
            HeaderFault::OtherRun(found) => OpenError::RunMismatch {
                path,
                expected: self.run.to_string(),
                found,
            },
            HeaderFault::Damaged => OpenError::Corrupt {
                path,
                offset: 0,
                reason: LogCorruption::HeaderChecksum,
            },
        })
    }

    /// Takes `mark` as the current high-water mark read from the file: only what it says
    /// was durable before its sync is known durable (that sync may not have returned).
    fn set_mark(&mut self, mark: Mark) {
        self.mark = mark;
        self.durable_records = mark.durable_records;
        self.durable_end = mark.durable_end;
    }

    /// The identity a checkpoint of this log must carry.
    fn identity(&self) -> std::io::Result<Identity> {
        let header = format::file_header(&self.run);
        let mut crc = [0u8; 4];
        crc.copy_from_slice(&header[header.len() - 4..]);
        Identity::of(
            &self.file,
            u32::from_le_bytes(crc),
            self.marks_at + (MARK_SLOTS * MARK_LEN) as u64,
        )
    }

    /// Takes the frames an earlier open verified from the log's checkpoint, if it has one
    /// that checks out against this file (`docs/format.md`, "Open checkpoint"), as the
    /// start of the index; the scan goes on from their end. A checkpoint refused is
    /// removed (unless read-only). Returns where the covered frames end.
    fn load_checkpoint(&mut self) -> Result<u64, OpenError> {
        let start = self.end;
        let Some(bytes) = checkpoint::read(&self.path).map_err(open_io(&self.path))? else {
            return Ok(start);
        };
        let identity = self.identity().map_err(open_io(&self.path))?;
        let len = self.file_len()?;
        let entries = checkpoint::decode(&bytes, &identity, len).ok();
        // Its last frame must still be there and whole: zeros or a cut from any frame it
        // covers to the end of the file leave that frame damaged or gone.
        let entries = match entries {
            Some(entries) => match entries.last() {
                Some(last) if self.whole_frame_at(last.offset, len)? != Some(last.header) => None,
                _ => Some(entries),
            },
            None => None,
        };
        let Some(entries) = entries else {
            if !self.read_only {
                let path = checkpoint::path_for(&self.path);
                match std::fs::remove_file(&path) {
                    Ok(()) => {}
                    Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                    Err(err) => return Err(open_io(&path)(err)),
                }
            }
            return Ok(start);
        };
        self.first_touch = crate::touch::FirstTouch::covering(entries.len());
        if let Some(last) = entries.last() {
            self.end = last.offset + last.header.frame_len();
            // Its body checksum was checked just above (`whole_frame_at`): not again on its
            // first content read.
            self.first_touch.verified(last.header.seq);
        }
        self.index = entries;
        Ok(self.end)
    }

    /// Writes a checkpoint of every frame in the index: each was verified by this open's
    /// scan or by an earlier one's (the checkpoint this open took them from).
    fn write_checkpoint(&self) -> std::io::Result<()> {
        checkpoint::write(&self.path, &self.identity()?, &self.index)
    }

    fn file_len(&self) -> Result<u64, OpenError> {
        Ok(self.file.metadata().map_err(open_io(&self.path))?.len())
    }

    /// Reads every frame after the header, checking both checksums, and builds the index.
    /// On the first bad frame, decides torn tail (cut, reported) or mid-file damage (error).
    fn scan(&mut self) -> Result<Option<TailLoss>, OpenError> {
        if self.end < self.marks_at + (MARK_SLOTS * MARK_LEN) as u64 {
            // Read-only, a file whose creation never began: no header, no frame.
            return Ok(None);
        }
        let mut len = self.file_len()?;
        let mut pos = self.end;
        let mut fault = self.scan_frames(&mut pos, len)?;
        #[cfg(test)]
        tests::after_scan();
        let (at_end, damage) = loop {
            let records = self.index.len() as u64;
            // The log's end as its last write left it: the end mark of these records, then
            // nothing or preallocated zeros.
            let at_end = fault.is_some()
                && self.end_mark_at(pos, len)? == Some(EndMark::new(records, pos))
                && self.all_zero(pos + END_MARK_LEN as u64, len)?;
            // What follows the last whole frame, as a reason to cut it: nothing when the
            // file ends there or only zeros follow (frames zeroed or cut off since, unless
            // the end mark is there; the high-water mark and the end mark tell, below).
            let damage = match fault {
                _ if at_end => None,
                Some((damage, search_from)) if !self.all_zero(pos, len)? => {
                    match self.damage_reason(damage, search_from, pos, len) {
                        Err(err @ OpenError::Corrupt { .. }) if self.read_only => {
                            if self.scanned_on(&mut pos, &mut len, &mut fault)? {
                                continue;
                            }
                            return Err(err);
                        }
                        reason => Some(reason?),
                    }
                }
                _ => None,
            };
            break (at_end, damage);
        };
        self.end = pos;
        self.allocated = len;
        let records = self.index.len() as u64;
        let mark_end = pos + END_MARK_LEN as u64;
        self.check_mark(records, pos, len, damage.as_ref())?;
        let written = self.mark.written_records;
        let lost_synced = (records < written).then(|| written - 1);
        let reason = match damage {
            Some(mut reason) => {
                if let TailReason::Damaged { last_synced, .. }
                | TailReason::TornWrite { last_synced, .. } = &mut reason
                {
                    *last_synced = lost_synced;
                }
                Some(reason)
            }
            None => match lost_synced {
                Some(last) => Some(TailReason::LastWriteMissing {
                    first: records,
                    last,
                    at: pos,
                    file_ends: pos == len,
                }),
                None => (!at_end).then_some(TailReason::EndMarkMissing {
                    at: pos,
                    file_ends: pos == len,
                }),
            },
        };
        if self.read_only {
            return Ok(reason.map(|reason| TailLoss {
                offset: pos,
                bytes: len - pos,
                reason,
                left_in_place: true,
            }));
        }
        let Some(reason) = reason else {
            if self.sync.syncs() && records > self.durable_records {
                // Frames the mark does not prove durable (their sync may not have returned
                // before a crash): made durable now, so the next mark counts them.
                self.storage
                    .sync_data(&self.file)
                    .map_err(open_io(&self.path))?;
                self.synced(None);
            }
            return Ok(None);
        };
        self.storage
            .set_len(&self.file, pos)
            .map_err(open_io(&self.path))?;
        // A mark naming the lost records would report them again on every open.
        let mark = (records < written).then(|| self.next_mark(records));
        if let Some(mark) = &mark {
            self.write_mark(mark).map_err(open_io(&self.path))?;
        }
        // The end mark again after the last whole frame, so the loss is reported once.
        self.write_end_mark().map_err(open_io(&self.path))?;
        self.storage
            .sync_data(&self.file)
            .map_err(open_io(&self.path))?;
        self.allocated = mark_end;
        self.synced(mark);
        Ok(Some(TailLoss {
            offset: pos,
            bytes: len - pos,
            reason,
            left_in_place: false,
        }))
    }

    /// Reads whole frames from `at` (moved past the last one read) in a file of `len`
    /// bytes, checking both checksums and adding each to the index; returns the first bad
    /// frame's damage and where whole frames may start after it, if anywhere (`None`: the
    /// file ends at a frame's end).
    fn scan_frames(&mut self, at: &mut u64, len: u64) -> Result<Option<Fault>, OpenError> {
        let mut pos = *at;
        let mut reader = BufReader::with_capacity(SCAN_CHUNK, &self.file);
        reader
            .seek(SeekFrom::Start(pos))
            .map_err(open_io(&self.path))?;
        // (damage, where to look for whole frames after it, if anywhere)
        let fault = loop {
            if pos >= len {
                break None;
            }
            if len - pos < FRAME_HEADER_LEN as u64 {
                break Some((FrameDamage::IncompleteHeader, Some(pos + 1)));
            }
            let mut raw = [0u8; FRAME_HEADER_LEN];
            reader.read_exact(&mut raw).map_err(open_io(&self.path))?;
            let header = match FrameHeader::decode(&raw) {
                Ok(header) => header,
                Err(damage) => break Some((damage, Some(pos + 1))),
            };
            let expected = self.index.len() as u64;
            if header.seq != expected {
                break Some((
                    FrameDamage::OutOfPlace {
                        found: header.seq,
                        expected,
                    },
                    Some(pos + 1),
                ));
            }
            let frame_len = header.frame_len();
            if frame_len > len - pos {
                // The header is whole and says the frame runs past the end: a torn write.
                break Some((FrameDamage::CutShort, None));
            }
            // The body is checksummed where it lies in the reader's buffer, not copied out.
            let mut crc = Crc32c::new();
            let mut left = frame_len - (FRAME_HEADER_LEN + FRAME_TRAILER_LEN) as u64;
            while left > 0 {
                let buffered = reader.fill_buf().map_err(open_io(&self.path))?;
                if buffered.is_empty() {
                    // The length was checked above: the file shrank under us.
                    return Err(open_io(&self.path)(
                        std::io::ErrorKind::UnexpectedEof.into(),
                    ));
                }
                let take = left.min(buffered.len() as u64) as usize;
                crc.update(&buffered[..take]);
                reader.consume(take);
                left -= take as u64;
            }
            let mut stored = [0u8; FRAME_TRAILER_LEN];
            reader
                .read_exact(&mut stored)
                .map_err(open_io(&self.path))?;
            if crc.finish() != u32::from_le_bytes(stored) {
                break Some((FrameDamage::BodyChecksum, Some(pos + frame_len)));
            }
            self.index.push(Entry {
                offset: pos,
                header,
            });
            if self.read_only {
                self.trailers.push(u32::from_le_bytes(stored));
            }
            pos += frame_len;
        };
        drop(reader);
        *at = pos;
        Ok(fault)
    }

    /// Read-only, a writer may be appending meanwhile: what the scan's buffer held at
    /// `pos` may be older than what was read after it (zeros or a frame half written
    /// where a whole frame now lies, and whole frames after it), which looks like damage
    /// before whole frames. Scans on from `pos` in the file as it is now; says whether
    /// that went past it (the damage was such a stale view).
    fn scanned_on(
        &mut self,
        pos: &mut u64,
        len: &mut u64,
        fault: &mut Option<Fault>,
    ) -> Result<bool, OpenError> {
        let from = *pos;
        let now = self.file_len()?;
        if now < from {
            // Cut back meanwhile (a writer undoing a failed append): no frame to read on.
            return Ok(false);
        }
        *len = now;
        *fault = self.scan_frames(pos, *len)?;
        Ok(*pos > from)
    }

    /// Damage at `pos` (record `self.len()`), not zeros only: decides whether it is a torn
    /// tail (returns why, to cut it) or is followed by whole frames that are not the rest of
    /// a torn last write ([`OpenError::Corrupt`]). `search_from` is where whole frames may
    /// start after it, if anywhere.
    fn damage_reason(
        &self,
        damage: FrameDamage,
        search_from: Option<u64>,
        pos: u64,
        len: u64,
    ) -> Result<TailReason, OpenError> {
        let Some(at) = search_from
            .map(|from| self.find_whole_frame(from, len))
            .transpose()?
            .flatten()
        else {
            return Ok(TailReason::Damaged {
                damage,
                last_synced: None,
            });
        };
        let damaged = self.index.len() as u64;
        let Some(last) = self.torn_write_end(at, damaged, len)? else {
            return Err(OpenError::Corrupt {
                path: self.path.clone(),
                offset: pos,
                reason: LogCorruption::DamageBeforeWholeFrame {
                    damage,
                    whole_at: at,
                },
            });
        };
        Ok(TailReason::TornWrite {
            first: damaged,
            last,
            damage,
            damaged_at: pos,
            whole_from: at,
            last_synced: None,
        })
    }

    /// Checks the `records` whole frames found (ending at `pos`; the file is `len` bytes)
    /// against the high-water mark: every record it says a returned sync made durable must
    /// be there and end where it says. What follows the frames is `damage`, or nothing or
    /// zeros.
    fn check_mark(
        &self,
        records: u64,
        pos: u64,
        len: u64,
        damage: Option<&TailReason>,
    ) -> Result<(), OpenError> {
        let mark = self.mark;
        let corrupt = |offset, reason| OpenError::Corrupt {
            path: self.path.clone(),
            offset,
            reason,
        };
        if records < mark.durable_records {
            let after = match damage {
                Some(reason) => AfterFrames::Damage(Box::new(reason.clone())),
                None if pos == len => AfterFrames::End,
                None => AfterFrames::Zeros,
            };
            return Err(corrupt(
                pos,
                LogCorruption::DurableMissing {
                    first: records,
                    durable_records: mark.durable_records,
                    durable_end: mark.durable_end,
                    after,
                },
            ));
        }
        let frames_start = self.marks_at + (MARK_SLOTS * MARK_LEN) as u64;
        let boundary = match mark.durable_records.checked_sub(1) {
            None => Some(frames_start),
            Some(last) => usize::try_from(last)
                .ok()
                .and_then(|last| self.index.get(last))
                .map(|entry| entry.offset + entry.header.frame_len()),
        };
        if boundary != Some(mark.durable_end) {
            return Err(corrupt(
                self.marks_at,
                LogCorruption::MarkMismatch {
                    durable_records: mark.durable_records,
                    mark_end: mark.durable_end,
                    actual_end: boundary.unwrap_or(pos),
                },
            ));
        }
        Ok(())
    }

    /// The end mark at `at`, if a valid one is there.
    fn end_mark_at(&self, at: u64, len: u64) -> Result<Option<EndMark>, OpenError> {
        if len.saturating_sub(at) < END_MARK_LEN as u64 {
            return Ok(None);
        }
        let mut raw = [0u8; END_MARK_LEN];
        self.file
            .read_exact_at(&mut raw, at)
            .map_err(open_io(&self.path))?;
        Ok(EndMark::decode(&raw))
    }

    /// Whether every byte in `from..len` is zero.
    fn all_zero(&self, from: u64, len: u64) -> Result<bool, OpenError> {
        let mut buf = vec![0u8; (len - from).min(SCAN_CHUNK as u64) as usize];
        let mut pos = from;
        while pos < len {
            let take = (len - pos).min(buf.len() as u64) as usize;
            self.file
                .read_exact_at(&mut buf[..take], pos)
                .map_err(open_io(&self.path))?;
            if buf[..take].iter().any(|&b| b != 0) {
                return Ok(false);
            }
            pos += take as u64;
        }
        Ok(true)
    }

    /// The offset of the first whole, checksummed frame starting in `from..len` whose
    /// position is at least the next expected one, if any.
    fn find_whole_frame(&self, from: u64, len: u64) -> Result<Option<u64>, OpenError> {
        let finder = memchr::memmem::Finder::new(&FRAME_MAGIC);
        let mut buf = vec![0u8; SCAN_CHUNK];
        let mut start = from;
        while start + FRAME_MAGIC.len() as u64 <= len {
            let take = (len - start).min(buf.len() as u64) as usize;
            self.file
                .read_exact_at(&mut buf[..take], start)
                .map_err(open_io(&self.path))?;
            for hit in finder.find_iter(&buf[..take]) {
                let at = start + hit as u64;
                if self.is_whole_frame(at, len)? {
                    return Ok(Some(at));
                }
            }
            if start + take as u64 >= len {
                break;
            }
            // Overlap so a magic split across chunks is still found.
            start += (take - (FRAME_MAGIC.len() - 1)) as u64;
        }
        Ok(None)
    }

    /// Damage at record `damaged` is followed by the whole frame at `at`. Decides whether
    /// the damage is the tearing of the last write (its pages reached the disk out of order
    /// before a power loss), and returns that write's last record if so: when the frame's
    /// write began at or before the damaged record (its `seq` minus its write index is at
    /// most `damaged`; a capped index only makes that start look later, never earlier) and
    /// every frame after it is whole and of the same write (next `seq`, next write index)
    /// up to the end of the file or to zeros only. Anything else may be damage in a write
    /// that was synced, so `None`: corruption.
    fn torn_write_end(&self, at: u64, damaged: u64, len: u64) -> Result<Option<u64>, OpenError> {
        let Some(mut frame) = self.whole_frame_at(at, len)? else {
            return Ok(None);
        };
        let began = frame.seq.checked_sub(u64::from(frame.write_index));
        if frame.seq < damaged || began.is_none_or(|began| began > damaged) {
            return Ok(None);
        }
        let mut pos = at + frame.frame_len();
        loop {
            let next_seq = frame.seq.saturating_add(1);
            if pos == len
                || self.all_zero(pos, len)?
                || (self.end_mark_at(pos, len)? == Some(EndMark::new(next_seq, pos))
                    && self.all_zero(pos + END_MARK_LEN as u64, len)?)
            {
                return Ok(Some(frame.seq));
            }
            let Some(next) = self.whole_frame_at(pos, len)? else {
                return Ok(None);
            };
            let same_write = Some(next.seq) == frame.seq.checked_add(1)
                && next.write_index == frame.write_index.saturating_add(1);
            if !same_write {
                return Ok(None);
            }
            pos += next.frame_len();
            frame = next;
        }
    }

    /// Whether a whole frame at `at` holds a position at least the next expected one.
    fn is_whole_frame(&self, at: u64, len: u64) -> Result<bool, OpenError> {
        Ok(self
            .whole_frame_at(at, len)?
            .is_some_and(|header| header.seq >= self.index.len() as u64))
    }

    /// The header of the frame at `at` if the frame is whole: its header checks out, it
    /// ends within `len`, and its body checksum holds.
    fn whole_frame_at(&self, at: u64, len: u64) -> Result<Option<FrameHeader>, OpenError> {
        if len - at < FRAME_HEADER_LEN as u64 {
            return Ok(None);
        }
        let mut raw = [0u8; FRAME_HEADER_LEN];
        self.file
            .read_exact_at(&mut raw, at)
            .map_err(open_io(&self.path))?;
        let Ok(header) = FrameHeader::decode(&raw) else {
            return Ok(None);
        };
        if header.frame_len() > len - at {
            return Ok(None);
        }
        let holds = self
            .body_checksum_holds(at, &header)
            .map_err(|(_, err)| open_io(&self.path)(err))?;
        Ok(holds.then_some(header))
    }

    /// Whether the body of the frame at `at`, whose header is `header` (its length within
    /// the file), matches the checksum in its trailer: read in chunks of at most
    /// `SCAN_CHUNK` bytes, so in bounded memory whatever the frame's size. Used on open and
    /// on a checkpointed frame's first touch (`touch.rs`).
    ///
    /// # Errors
    ///
    /// The read that failed, with the byte offset it was at.
    pub(crate) fn body_checksum_holds(
        &self,
        at: u64,
        header: &FrameHeader,
    ) -> Result<bool, (u64, std::io::Error)> {
        let mut crc = Crc32c::new();
        let mut pos = at + FRAME_HEADER_LEN as u64;
        let body_end = at + header.frame_len() - FRAME_TRAILER_LEN as u64;
        let mut buf = vec![0u8; (body_end - pos).min(SCAN_CHUNK as u64) as usize];
        while pos < body_end {
            let take = (body_end - pos).min(buf.len() as u64) as usize;
            self.file
                .read_exact_at(&mut buf[..take], pos)
                .map_err(|err| (pos, err))?;
            crc.update(&buf[..take]);
            pos += take as u64;
        }
        let mut stored = [0u8; FRAME_TRAILER_LEN];
        self.file
            .read_exact_at(&mut stored, body_end)
            .map_err(|err| (body_end, err))?;
        Ok(crc.finish() == u32::from_le_bytes(stored))
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use psych_types::{Record, RunId, UserMessage};

    use crate::{RecordLog, SyncPolicy};

    type Hook = Box<dyn FnOnce()>;

    thread_local! {
        /// Run once after a scan's first pass over the frames, before its verdict on what
        /// ends it (this thread's next open): a test's writer.
        static AFTER_SCAN: RefCell<Option<Hook>> = const { RefCell::new(None) };
    }

    pub(super) fn after_scan() {
        if let Some(hook) = AFTER_SCAN.with(|hook| hook.borrow_mut().take()) {
            hook();
        }
    }

    /// Review: two frames appended after a read-only scan read the log's end and before it
    /// judged it made the open `Corrupt` (the end mark it read, then whole frames found
    /// after it); the open now reads on from there and serves them.
    #[test]
    fn frames_appended_between_a_read_only_scan_and_its_verdict_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunId::new("live").unwrap();
        let user = |text: &str| Record::User(UserMessage { text: text.into() });
        let (mut writer, _) = RecordLog::open(dir.path(), &run, SyncPolicy::OsBuffered).unwrap();
        writer.append(&user("before")).unwrap();
        AFTER_SCAN.with(|hook| {
            *hook.borrow_mut() = Some(Box::new(move || {
                writer.append(&user("during 1")).unwrap();
                writer.append(&user("during 2")).unwrap();
            }));
        });
        let (reader, recovery) = RecordLog::open_read_only(dir.path(), &run).unwrap();
        assert!(recovery.is_clean(), "{recovery}");
        assert_eq!(reader.len(), 3);
    }
}
