//! A Run's history for prompt assembly without the content of its tool results: each
//! result is a [`StoredResult`] (what the projector needs to decide its view) and its bytes
//! are read on demand through [`OutputAccess`].
//!
//! Assembling a step from the whole records ([`LoggedRecord`]) reads every result whole,
//! so a step costs what the log holds. A [`History`] costs what the model sees: results
//! behind the elision boundary are projected from their [`StoredResult`] and the few bytes
//! of head and tail a preview shows; only results sent whole are read whole.

use crate::{
    LoggedRecord, OutputInfo, OutputKind, Projection, Record, RecordHandle, RecordSource,
    ResultRef, TokenEstimator, ToolOutput,
};

/// What is known of a stored tool result without reading its content: enough for a
/// projector to plan the batch and cut a preview with a few positional reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResult {
    /// Kind, length of the readable text, error flag, call id and tool name.
    pub info: OutputInfo,
    /// The token estimate of the whole output ([`TokenEstimator::estimate_output`]) stored
    /// when it was appended; `None` for a record stored without one (the projector then
    /// computes it from the output on first need).
    pub estimate: Option<u64>,
    /// Line breaks (`\n` bytes) in the readable text, when stored; `None` makes a projector
    /// that needs them count them.
    pub line_breaks: Option<u64>,
    /// Whether the readable text is all the output holds: its blocks are all text blocks
    /// (or it is only structured content), so no placeholder line and no binary data.
    pub text_only: bool,
    /// The remote tool the call reached ([`ToolResult::target`](crate::ToolResult::target)).
    pub target: Option<crate::ToolRef>,
}

impl StoredResult {
    /// The summary of a whole output, with its estimate by `estimator` when given; no
    /// [`target`](Self::target) (set it from the result's).
    pub fn of(
        output: &ToolOutput,
        info: OutputInfo,
        estimator: Option<&dyn TokenEstimator>,
    ) -> Self {
        let text = output.readable_text();
        Self {
            info,
            estimate: estimator.map(|e| e.estimate_output(output)),
            line_breaks: Some(count_line_breaks(text.as_bytes())),
            text_only: is_text_only(output),
            target: None,
        }
    }
}

/// Line breaks (`\n` bytes) in `bytes`.
///
/// Counted in chunks of 240 bytes, each into a `u8` that cannot overflow, so
/// the compiler keeps 16 counts to a vector register (a `usize` count widens every byte
/// to 64 bits): 30 GB/s against 1.9 on the elision crate's held-out corpus, measured side
/// by side in one process. The record log counts every result's text on append, and
/// elision every large one.
pub fn count_line_breaks(bytes: &[u8]) -> u64 {
    let (chunks, rest) = bytes.as_chunks::<COUNT_CHUNK>();
    let whole: u64 = chunks
        .iter()
        .map(|chunk| u64::from(chunk.iter().fold(0u8, |n, &b| n + u8::from(b == b'\n'))))
        .sum();
    whole + rest.iter().filter(|&&b| b == b'\n').count() as u64
}

/// Bytes [`count_line_breaks`] counts into one `u8`: at most 255, and a multiple of 16.
const COUNT_CHUNK: usize = 240;

/// Whether `output`'s readable text is all it holds (see [`StoredResult::text_only`]).
fn is_text_only(output: &ToolOutput) -> bool {
    output
        .content
        .iter()
        .all(|block| matches!(block, crate::ContentBlock::Text(_)))
}

/// One record of a [`History`]: whole, or (a tool result) its [`StoredResult`].
#[derive(Debug, Clone, PartialEq)]
pub enum HistoryItem {
    /// A record held whole: user and assistant messages, usage, and tool results a caller
    /// chose to keep whole.
    Record(Record),
    /// A tool result, its content left in the store.
    Result(StoredResult),
}

/// One entry of a [`History`]: a handle and what the history holds of its record.
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryEntry {
    /// Where the record lives.
    pub handle: RecordHandle,
    /// The record, or its tool result's summary.
    pub item: HistoryItem,
}

/// A Run's records in order, tool results as [`StoredResult`]s: the input of lazy prompt
/// assembly. Built by a store (the record log's `history()`), or from whole records with
/// [`History::from_records`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct History {
    /// The entries, in log order.
    pub entries: Vec<HistoryEntry>,
}

impl History {
    /// The lazy history of whole records: each tool result summarized (its estimate by
    /// `estimator` when given, as a store would have stored it at append time).
    pub fn from_records(records: &[LoggedRecord], estimator: Option<&dyn TokenEstimator>) -> Self {
        let entries = records
            .iter()
            .map(|logged| HistoryEntry {
                handle: logged.handle.clone(),
                item: match &logged.record {
                    Record::ToolResult(result) => {
                        let info = OutputInfo {
                            kind: OutputKind::of(&result.output),
                            len: result.output.readable_text().len() as u64,
                            is_error: result.output.is_error,
                            call_id: result.call_id.clone(),
                            name: result.name.clone(),
                        };
                        let mut stored = StoredResult::of(&result.output, info, estimator);
                        stored.target.clone_from(&result.target);
                        HistoryItem::Result(stored)
                    }
                    other => HistoryItem::Record(other.clone()),
                },
            })
            .collect();
        Self { entries }
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the history has no entry.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Why a stored result could not be read for a projection or for sending it whole.
#[derive(Debug, thiserror::Error)]
#[error("reading stored result {handle}: {source}")]
pub struct SourceError {
    /// The result being read.
    pub handle: RecordHandle,
    /// The store's error.
    pub source: Box<dyn std::error::Error + Send + Sync + 'static>,
}

/// Reads stored tool results by handle: the object-safe part of [`RecordSource`] that lazy
/// projection and assembly need. Every `RecordSource` is one.
pub trait OutputAccess {
    /// Copies readable text of the result at `handle` from byte `offset` into `buf`, as
    /// [`RecordSource::read_output`] does.
    ///
    /// # Errors
    ///
    /// The store's failure, as a [`SourceError`].
    fn read_output(
        &self,
        handle: &RecordHandle,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize, SourceError>;

    /// The whole output of the tool result at `handle`; `None` when the handle does not
    /// resolve to a tool result.
    ///
    /// # Errors
    ///
    /// The store's failure, as a [`SourceError`].
    fn load_output(&self, handle: &RecordHandle) -> Result<Option<ToolOutput>, SourceError>;

    /// The non-text blocks of the tool result at `handle`, as a preview lists them; `None`
    /// when the handle does not resolve to a tool result. As
    /// [`RecordSource::block_lines`] does: a store that keeps its blocks' shapes apart
    /// from their bulk answers without reading the content.
    ///
    /// # Errors
    ///
    /// The store's failure, as a [`SourceError`].
    fn block_lines(&self, handle: &RecordHandle) -> Result<Option<BlockLines>, SourceError> {
        Ok(self
            .load_output(handle)?
            .map(|output| BlockLines::of(&output)))
    }
}

/// The blocks of a stored tool result other than text, as its preview names them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlockLines {
    /// Each such block's [placeholder line](crate::ContentBlock::placeholder), in block order.
    pub placeholders: Vec<String>,
    /// Whether a block holds binary data (an image, audio, a blob resource).
    pub has_binary: bool,
}

impl BlockLines {
    /// The lines of `output`'s blocks.
    pub fn of(output: &ToolOutput) -> Self {
        Self {
            placeholders: output
                .content
                .iter()
                .enumerate()
                .filter_map(|(i, block)| block.placeholder(i))
                .collect(),
            has_binary: output.binary_blocks().next().is_some(),
        }
    }
}

impl<S: RecordSource + ?Sized> OutputAccess for S {
    fn read_output(
        &self,
        handle: &RecordHandle,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize, SourceError> {
        RecordSource::read_output(self, handle, offset, buf).map_err(|source| SourceError {
            handle: handle.clone(),
            source: Box::new(source),
        })
    }

    fn load_output(&self, handle: &RecordHandle) -> Result<Option<ToolOutput>, SourceError> {
        match self.record(handle) {
            Ok(Some(Record::ToolResult(result))) => Ok(Some(result.output)),
            Ok(_) => Ok(None),
            Err(source) => Err(SourceError {
                handle: handle.clone(),
                source: Box::new(source),
            }),
        }
    }

    fn block_lines(&self, handle: &RecordHandle) -> Result<Option<BlockLines>, SourceError> {
        RecordSource::block_lines(self, handle).map_err(|source| SourceError {
            handle: handle.clone(),
            source: Box::new(source),
        })
    }
}

/// Reads `buf.len()` bytes of readable text from `offset`, or fewer only at the end.
///
/// # Errors
///
/// The store's failure.
pub fn read_exact_output(
    source: &dyn OutputAccess,
    handle: &RecordHandle,
    offset: u64,
    buf: &mut [u8],
) -> Result<usize, SourceError> {
    let mut filled = 0;
    while filled < buf.len() {
        let n = source.read_output(handle, offset + filled as u64, &mut buf[filled..])?;
        if n == 0 {
            break;
        }
        filled += n;
    }
    Ok(filled)
}

/// One stored tool result handed to [`ResultProjector::project_stored`](crate::ResultProjector::project_stored).
#[derive(Debug, Clone, Copy)]
pub struct StoredRef<'a> {
    /// Where the full result lives.
    pub handle: &'a RecordHandle,
    /// What is known of it without its content.
    pub stored: &'a StoredResult,
}

/// The default of [`ResultProjector::project_stored`](crate::ResultProjector::project_stored):
/// every output read whole, then [`ResultProjector::project`](crate::ResultProjector::project).
///
/// # Errors
///
/// A result that cannot be read, or that does not resolve (its handle names no tool
/// result of the source).
pub(crate) fn project_loaded(
    projector: &(impl crate::ResultProjector + ?Sized),
    batch: &[StoredRef<'_>],
    source: &dyn OutputAccess,
) -> Result<Vec<Projection>, SourceError> {
    let mut outputs = Vec::with_capacity(batch.len());
    for item in batch {
        outputs.push(load_whole(source, item.handle)?);
    }
    let refs: Vec<ResultRef<'_>> = batch
        .iter()
        .zip(&outputs)
        .map(|(item, output)| ResultRef {
            handle: item.handle,
            output,
            target: item.stored.target.as_ref(),
        })
        .collect();
    Ok(projector.project(&refs))
}

/// The whole output at `handle`; a handle that does not resolve is an error here (a
/// history names only results its source holds).
///
/// # Errors
///
/// The store's failure, or the handle not resolving.
pub fn load_whole(
    source: &dyn OutputAccess,
    handle: &RecordHandle,
) -> Result<ToolOutput, SourceError> {
    source.load_output(handle)?.ok_or_else(|| SourceError {
        handle: handle.clone(),
        source: "the handle names no tool result of this source".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MemoryRecords, RunId, ToolCallId, ToolResult, UserMessage};

    #[test]
    fn line_breaks_are_counted_across_chunks_and_in_the_rest() {
        // Every length around one and two chunks, every byte a break or none, and breaks
        // at every 7th byte: the chunked count equals the plain one.
        let plain = |b: &[u8]| b.iter().filter(|&&x| x == b'\n').count() as u64;
        for len in (0..3 * COUNT_CHUNK).chain([10_000, 65_537]) {
            let all = vec![b'\n'; len];
            let none = vec![b'x'; len];
            let some: Vec<u8> = (0..len)
                .map(|i| if i % 7 == 3 { b'\n' } else { b'a' })
                .collect();
            for bytes in [&all, &none, &some] {
                assert_eq!(count_line_breaks(bytes), plain(bytes), "len {len}");
            }
        }
        assert_eq!(count_line_breaks(&vec![b'\n'; 100_000]), 100_000);
    }

    /// Replaces each result with its handle and its first byte: a projector that needs
    /// the whole output, and so keeps `project_stored`'s default.
    struct FirstByte;

    impl crate::ResultProjector for FirstByte {
        fn project(&self, batch: &[ResultRef<'_>]) -> Vec<Projection> {
            batch
                .iter()
                .map(|r| {
                    let text = r.output.readable_text();
                    Projection::Replaced(format!("{} {:?}", r.handle, text.chars().next()))
                })
                .collect()
        }
    }

    #[test]
    fn the_default_stored_projection_reads_whole_outputs_and_projects_them() {
        use crate::ResultProjector;
        let mut log = MemoryRecords::new(RunId::new("r").unwrap());
        let outputs = [ToolOutput::text("xyz"), ToolOutput::error("boom")];
        let handles: Vec<RecordHandle> = outputs
            .iter()
            .enumerate()
            .map(|(i, output)| {
                log.push(Record::ToolResult(ToolResult {
                    target: None,
                    call_id: ToolCallId::new(format!("c{i}")).unwrap(),
                    name: "t".into(),
                    output: output.clone(),
                }))
            })
            .collect();
        let history = History::from_records(&log.records(), None);
        let stored: Vec<StoredRef<'_>> = history
            .entries
            .iter()
            .filter_map(|entry| match &entry.item {
                HistoryItem::Result(stored) => Some(StoredRef {
                    handle: &entry.handle,
                    stored,
                }),
                HistoryItem::Record(_) => None,
            })
            .collect();
        let whole: Vec<ResultRef<'_>> = handles
            .iter()
            .zip(&outputs)
            .map(|(handle, output)| ResultRef {
                handle,
                output,
                target: None,
            })
            .collect();
        let views = FirstByte.project_stored(&stored, &log).unwrap();
        assert_eq!(views, FirstByte.project(&whole));
        assert_eq!(views[1], Projection::Replaced("r:1 Some('b')".into()));

        // A handle naming no tool result of the source is an error, not a guess.
        let unissued = RecordHandle::new(RunId::new("r").unwrap(), 9);
        let missing = [StoredRef {
            handle: &unissued,
            stored: stored[0].stored,
        }];
        let error = FirstByte.project_stored(&missing, &log).unwrap_err();
        assert_eq!(error.handle, unissued);
    }

    #[test]
    fn a_history_summarizes_results_and_reads_them_back() {
        let mut log = MemoryRecords::new(RunId::new("r").unwrap());
        log.push(Record::User(UserMessage { text: "hi".into() }));
        let output = ToolOutput::text("a\nb\nc");
        let handle = log.push(Record::ToolResult(ToolResult {
            target: None,
            call_id: ToolCallId::new("c").unwrap(),
            name: "t".into(),
            output: output.clone(),
        }));
        let history = History::from_records(&log.records(), None);
        assert_eq!(history.len(), 2);
        let HistoryItem::Result(stored) = &history.entries[1].item else {
            panic!("{:?}", history.entries[1])
        };
        assert_eq!((stored.info.len, stored.line_breaks), (5, Some(2)));
        assert!(stored.text_only && stored.estimate.is_none());
        let mut buf = [0u8; 9];
        assert_eq!(read_exact_output(&log, &handle, 2, &mut buf).unwrap(), 3);
        assert_eq!(&buf[..3], b"b\nc");
        assert_eq!(load_whole(&log, &handle).unwrap(), output);
        let user = RecordHandle::new(RunId::new("r").unwrap(), 0);
        assert!(load_whole(&log, &user).is_err());
    }
}
