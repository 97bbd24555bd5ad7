//! Lazy assembly: a step assembled from a [`History`] (tool results as stored summaries)
//! reads whole only the results it sends whole; results behind the elision boundary are
//! projected through [`ResultProjector::project_stored`] and their projections kept per
//! handle in a [`ProjectionCache`] between steps.

use std::collections::HashMap;

use psych_types::{
    History, HistoryItem, LoggedRecord, OutputAccess, Projection, Record, RecordHandle,
    ResultProjector, ResultRef, SourceError, StoredRef, ToolOutput, ToolResult, load_whole,
};

use crate::assemble::{group, sent_flags, turns};
use crate::{AssembleError, Assembler, Prompt, Transient};

/// The projections of tool results behind the elision boundary, by handle, kept by the
/// caller from one step to the next.
///
/// A result's projection is fixed once its turn is behind the boundary (its batch no
/// longer changes), so a Run keeps one cache for its whole life and each turn's results
/// are projected once. Use one cache per Run and per projector configuration: a cache
/// filled by one projector gives its views to any other.
#[derive(Debug, Clone, Default)]
pub struct ProjectionCache {
    views: HashMap<RecordHandle, Projection>,
}

impl ProjectionCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of results whose projection is kept.
    pub fn len(&self) -> usize {
        self.views.len()
    }

    /// Whether no projection is kept.
    pub fn is_empty(&self) -> bool {
        self.views.is_empty()
    }

    /// The kept projection of the result at `handle`.
    pub fn get(&self, handle: &RecordHandle) -> Option<&Projection> {
        self.views.get(handle)
    }
}

/// One step's history, loaded for assembly: the results sent whole read whole, every
/// other tool result a stand-in holding its call id, name and error flag, and each
/// result's view. Made by [`StepHistory::load`], assembled by
/// [`Assembler::assemble_history`].
#[derive(Debug, Clone)]
pub struct StepHistory {
    records: Vec<LoggedRecord>,
    views: Vec<Projection>,
}

impl StepHistory {
    /// Loads `history` for one step: groups it as [`Assembler::assemble`] does, projects
    /// each turn behind the boundary (from `cache` when every sent result of the turn is
    /// there, else with [`ResultProjector::project_stored`] over `source`, and keeps the
    /// views in `cache`), then reads whole, through `source`, only the results whose view
    /// is [`Projection::Full`] and that are sent.
    ///
    /// The prompt assembled from it has exactly the bytes [`Assembler::assemble`] gives
    /// for the whole records with the same projector.
    ///
    /// # Errors
    ///
    /// [`AssembleError`] as `assemble` gives it, and [`AssembleError::Unreadable`] when
    /// `source` cannot read a result.
    pub fn load(
        history: &History,
        source: &dyn OutputAccess,
        projector: &dyn ResultProjector,
        cache: &mut ProjectionCache,
    ) -> Result<Self, AssembleError> {
        let mut records: Vec<LoggedRecord> = history
            .entries
            .iter()
            .map(|entry| LoggedRecord {
                handle: entry.handle.clone(),
                record: match &entry.item {
                    HistoryItem::Record(record) => record.clone(),
                    HistoryItem::Result(stored) => Record::ToolResult(ToolResult {
                        target: stored.target.clone(),
                        call_id: stored.info.call_id.clone(),
                        name: stored.info.name.clone(),
                        output: ToolOutput {
                            is_error: stored.info.is_error,
                            ..ToolOutput::default()
                        },
                    }),
                },
            })
            .collect();
        let sent = sent_flags(&group(&records)?, records.len());
        let boundary = records
            .iter()
            .rposition(|logged| matches!(logged.record, Record::User(_)));
        let mut views = vec![Projection::Full; records.len()];
        if let Some(boundary) = boundary {
            project_turns(
                history, boundary, &sent, source, projector, cache, &mut views,
            )?;
        }
        for (i, logged) in records.iter_mut().enumerate() {
            let stored = matches!(history.entries[i].item, HistoryItem::Result(_));
            if stored && sent[i] && views[i] == Projection::Full {
                let output = load_whole(source, &logged.handle).map_err(unreadable)?;
                if let Record::ToolResult(result) = &mut logged.record {
                    result.output = output;
                }
            }
        }
        Ok(Self { records, views })
    }

    /// The loaded records (stand-ins for results not sent whole), in history order.
    pub fn records(&self) -> &[LoggedRecord] {
        &self.records
    }
}

fn unreadable(error: SourceError) -> AssembleError {
    AssembleError::Unreadable {
        result: error.handle.clone(),
        reason: error.source.to_string(),
    }
}

/// Projects each turn before `boundary`, one batch per turn, as
/// `assemble::project_prior_turns` does for whole records.
fn project_turns(
    history: &History,
    boundary: usize,
    sent: &[bool],
    source: &dyn OutputAccess,
    projector: &dyn ResultProjector,
    cache: &mut ProjectionCache,
    views: &mut [Projection],
) -> Result<(), AssembleError> {
    let entries = &history.entries[..boundary];
    let is_user = |i: usize| matches!(entries[i].item, HistoryItem::Record(Record::User(_)));
    let is_result = |i: usize| {
        matches!(
            entries[i].item,
            HistoryItem::Result(_) | HistoryItem::Record(Record::ToolResult(_))
        )
    };
    for turn in turns(entries.len(), is_user) {
        let indices: Vec<usize> = turn.filter(|&i| sent[i] && is_result(i)).collect();
        if indices.is_empty() {
            continue;
        }
        let cached: Option<Vec<Projection>> = indices
            .iter()
            .map(|&i| cache.get(&entries[i].handle).cloned())
            .collect();
        let out = match cached {
            Some(out) => out,
            None => {
                let out = project_batch(entries, &indices, source, projector)?;
                for (&i, view) in indices.iter().zip(&out) {
                    cache.views.insert(entries[i].handle.clone(), view.clone());
                }
                out
            }
        };
        for (&i, view) in indices.iter().zip(out) {
            views[i] = view;
        }
    }
    Ok(())
}

/// The views of one turn's sent results: from their stored summaries when all are stored,
/// else (a history holding some results whole) from the whole outputs.
fn project_batch(
    entries: &[psych_types::HistoryEntry],
    indices: &[usize],
    source: &dyn OutputAccess,
    projector: &dyn ResultProjector,
) -> Result<Vec<Projection>, AssembleError> {
    let stored: Option<Vec<StoredRef<'_>>> = indices
        .iter()
        .map(|&i| match &entries[i].item {
            HistoryItem::Result(stored) => Some(StoredRef {
                handle: &entries[i].handle,
                stored,
            }),
            HistoryItem::Record(_) => None,
        })
        .collect();
    if let Some(batch) = stored {
        let out = projector
            .project_stored(&batch, source)
            .map_err(unreadable)?;
        return Ok(whole_if_missing(out, indices.len()));
    }
    let mut outputs = Vec::with_capacity(indices.len());
    for &i in indices {
        outputs.push(match &entries[i].item {
            HistoryItem::Record(Record::ToolResult(result)) => result.output.clone(),
            _ => load_whole(source, &entries[i].handle).map_err(unreadable)?,
        });
    }
    let batch: Vec<ResultRef<'_>> = indices
        .iter()
        .zip(&outputs)
        .map(|(&i, output)| ResultRef {
            handle: &entries[i].handle,
            output,
            target: match &entries[i].item {
                HistoryItem::Record(Record::ToolResult(result)) => result.target.as_ref(),
                HistoryItem::Result(stored) => stored.target.as_ref(),
                HistoryItem::Record(_) => None,
            },
        })
        .collect();
    Ok(whole_if_missing(projector.project(&batch), indices.len()))
}

/// Exactly `len` views: a result the projector gave no view for is shown whole, views past
/// the batch are dropped (see `ResultProjector`), so the cache holds one view per result.
fn whole_if_missing(mut views: Vec<Projection>, len: usize) -> Vec<Projection> {
    views.resize(len, Projection::Full);
    views
}

impl<'a> Assembler<'a> {
    /// Assembles the four zones for one model call from a loaded [`StepHistory`]: the
    /// lazy counterpart of [`Assembler::assemble`], with the same bytes.
    ///
    /// A Run that owns a record log assembles each step as
    /// `StepHistory::load(&log.history()?, &log, &projector, &mut cache)?` then this, keeping
    /// `cache` (and, with `extend_history`, the history) from step to step.
    ///
    /// # Errors
    ///
    /// As [`Assembler::assemble`].
    pub fn assemble_history(
        &self,
        step: &'a StepHistory,
        transient: &'a Transient,
    ) -> Result<Prompt<'a>, AssembleError> {
        self.assemble_with_views(&step.records, &step.views, transient)
    }
}
