//! The lazy read path: a Run's [`History`] for prompt assembly, read from each frame's
//! header and metadata without its content.
//!
//! [`RecordLog::iter`] reads, checksums and decodes every frame whole, so a step assembled
//! from it costs the whole log. [`RecordLog::history`] reads, per record, only the frame
//! header and the metadata: user, assistant and usage records whole (their frames have no
//! content, so their body checksum is checked again), each tool result as a
//! [`StoredResult`]: kind, readable length and error flag from the header, call id, name,
//! the stored token estimate and line-break count from the metadata.
//!
//! What is checked: every frame the index holds had its header and body checksums checked
//! when the log was opened (by this open, or, for frames taken from the open checkpoint,
//! by the open that wrote it), or was written by this log; each read here checks that the
//! frame header on disk is still the indexed one. A tool result's content is not read, so
//! its body checksum is not checked again; the bytes a projection then reads through
//! [`RecordSource::read_output`](psych_types::RecordSource::read_output) are checked as a
//! reader's slices are (at open or append, or, for a checkpointed frame, whole on its
//! first content read in this process), and a result sent whole is read with
//! [`RecordSource::record`](psych_types::RecordSource::record), which checks its body
//! checksum again.

use psych_types::{History, HistoryEntry, HistoryItem, RecordHandle, StoredResult};

use crate::log::output_info;
use crate::{ReadError, RecordLog, SharedRecordLog};

impl RecordLog {
    /// The Run's history for lazy prompt assembly: every record in order, tool results as
    /// [`StoredResult`]s read from their metadata, without their content. One positional
    /// read per record.
    ///
    /// # Errors
    ///
    /// [`ReadError`] when a read fails or a frame no longer checks out.
    pub fn history(&self) -> Result<History, ReadError> {
        let mut history = History::default();
        self.extend_history(&mut history)?;
        Ok(history)
    }

    /// Appends to `history` the records the log holds past its last entry, so that a Run
    /// reads each record's metadata once: keep the history between steps and extend it.
    /// `history` must have been read from this log (its entries are this log's first
    /// records).
    ///
    /// # Errors
    ///
    /// As [`history`](Self::history); `history` keeps the entries read before the error.
    pub fn extend_history(&self, history: &mut History) -> Result<(), ReadError> {
        let from = history.entries.len() as u64;
        for seq in from..self.len() {
            let handle = RecordHandle::new(self.run.clone(), seq);
            let item = self.history_item(&handle)?;
            history.entries.push(HistoryEntry { handle, item });
        }
        Ok(())
    }

    /// What is known of the tool result at `handle` without its content (the
    /// [`StoredResult`] its history entry holds), read with one positional read; `None`
    /// when `handle` names no tool result of this log. What a caller projecting one result
    /// it has just appended needs, without reading the history.
    ///
    /// # Errors
    ///
    /// [`ReadError`] when the read fails or the frame no longer checks out.
    pub fn stored_result(&self, handle: &RecordHandle) -> Result<Option<StoredResult>, ReadError> {
        Ok(self.result_summary(handle)?.map(stored_result))
    }

    fn history_item(&self, handle: &RecordHandle) -> Result<HistoryItem, ReadError> {
        if let Some(stored) = self.result_summary(handle)? {
            return Ok(HistoryItem::Result(stored_result(stored)));
        }
        // Not a tool result: no content, the whole frame is the header, the metadata and
        // the checksum.
        match self.read_record(handle)? {
            Some(record) => Ok(HistoryItem::Record(record)),
            // A record the index holds that `read_record` does not find.
            None => Err(self.corrupt(0, crate::cause::RecordCorruption::Vanished)),
        }
    }
}

/// A tool result's [`StoredResult`] from its checked header and metadata.
fn stored_result((entry, summary, readable): crate::log::StoredResult<'_>) -> StoredResult {
    StoredResult {
        target: summary.target(),
        estimate: summary.estimate(),
        line_breaks: summary.line_breaks(),
        text_only: summary.text_only(),
        info: output_info(entry, summary, readable),
    }
}

impl SharedRecordLog {
    /// [`RecordLog::history`] of the shared log (under its read lock, so appends wait for
    /// the metadata reads, not for any content).
    ///
    /// # Errors
    ///
    /// As [`RecordLog::history`].
    pub fn history(&self) -> Result<History, ReadError> {
        self.read_log().history()
    }

    /// [`RecordLog::stored_result`] of the shared log (under its read lock).
    ///
    /// # Errors
    ///
    /// As [`RecordLog::stored_result`].
    pub fn stored_result(&self, handle: &RecordHandle) -> Result<Option<StoredResult>, ReadError> {
        self.read_log().stored_result(handle)
    }

    /// [`RecordLog::extend_history`] of the shared log.
    ///
    /// # Errors
    ///
    /// As [`RecordLog::extend_history`].
    pub fn extend_history(&self, history: &mut History) -> Result<(), ReadError> {
        self.read_log().extend_history(history)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use psych_types::{
        ContentBlock, LoggedRecord, Record, RunId, TokenEstimator, ToolCallId, ToolOutput,
        ToolResult, UserMessage,
    };

    use super::*;
    use crate::SyncPolicy;

    /// A stand-in estimator: a token per 4 bytes of text, a token per 100 bytes of binary.
    struct Quarter;

    impl TokenEstimator for Quarter {
        fn estimate_text(&self, text: &str) -> u64 {
            text.len() as u64 / 4
        }

        fn estimate_binary(&self, _mime_type: &str, len: u64) -> u64 {
            len / 100
        }
    }

    fn result(id: &str, output: ToolOutput) -> Record {
        Record::ToolResult(ToolResult {
            target: None,
            call_id: ToolCallId::new(id).unwrap(),
            name: "t".into(),
            output,
        })
    }

    fn records() -> Vec<Record> {
        vec![
            Record::User(UserMessage { text: "go".into() }),
            result("a", ToolOutput::text("one\ntwo\nthree\n".repeat(50))),
            result(
                "b",
                ToolOutput::json(serde_json::json!({"k": [1, 2, {"x": "y"}]})),
            ),
            result("c", ToolOutput::error("boom\nat frame")),
            result(
                "d",
                ToolOutput::from_blocks(vec![
                    ContentBlock::text("see\n"),
                    ContentBlock::image("image/png", vec![1; 500]),
                ]),
            ),
            result(
                "e",
                ToolOutput::from_blocks(vec![ContentBlock::text("x"), ContentBlock::text("y")]),
            ),
        ]
    }

    fn whole(log: &RecordLog) -> Vec<LoggedRecord> {
        log.iter().collect::<Result<_, _>>().unwrap()
    }

    #[test]
    fn the_history_is_what_summarizing_the_whole_records_gives() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunId::new("h").unwrap();
        let (mut log, _) = RecordLog::open(dir.path(), &run, SyncPolicy::OsBuffered).unwrap();
        log.set_estimator(Arc::new(Quarter));
        let records = records();
        log.append_batch(&records[..3]).unwrap();
        let mut history = log.history().unwrap();
        for record in &records[3..] {
            log.append(record).unwrap();
        }
        log.extend_history(&mut history).unwrap();
        assert_eq!(history, History::from_records(&whole(&log), Some(&Quarter)));
        let HistoryItem::Result(stored) = &history.entries[4].item else {
            panic!("{:?}", history.entries[4]);
        };
        assert!(!stored.text_only, "an image is not text");
        assert!(matches!(&history.entries[5].item, HistoryItem::Result(s) if s.text_only));

        // Reopened, shared, and without an estimator: the same, with no estimate stored.
        log.sync().unwrap();
        drop(log);
        let (log, _) = RecordLog::open(dir.path(), &run, SyncPolicy::OsBuffered).unwrap();
        let shared = SharedRecordLog::new(log);
        assert_eq!(shared.history().unwrap(), history);
        let mut log = shared.into_inner();
        let more = result("f", ToolOutput::text("z"));
        let handle = log.append(&more).unwrap();
        log.extend_history(&mut history).unwrap();
        let HistoryItem::Result(stored) = &history.entries[6].item else {
            panic!("{:?}", history.entries[6]);
        };
        assert_eq!(history.entries[6].handle, handle);
        assert_eq!((stored.estimate, stored.line_breaks), (None, Some(0)));
    }
}
