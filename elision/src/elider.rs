//! [`Elider`], the `ResultProjector` of the workspace: estimates, plans and projects one
//! turn's tool results.

use std::borrow::Cow;

use psych_types::{
    BlockLines, OutputAccess, OutputLimits, Projection, RecordHandle, ResultProjector, ResultRef,
    SourceError, StoredRef, TokenEstimator, ToolOutput, ToolRef, load_whole, read_exact_output,
};

use crate::preview::Windows;

use crate::{Estimator, PreviewConfig, Thresholds, plan_each};

/// Decides what the model sees of one turn's tool results: the elision plan over the
/// successes, head+tail previews for the elided ones, hard truncation for failures.
///
/// Every result is seen through its readable text
/// ([`ToolOutput::readable_text`](psych_types::ToolOutput::readable_text)): its text blocks
/// with one placeholder line per image, audio, resource or unknown block, or the JSON text
/// view of a result that is only structured content (the bytes the reader tool serves).
///
/// - A **success** is estimated with [`TokenEstimator::estimate_output`] (its readable text,
///   plus each binary block at its base64 cost) and planned with [`plan_each`] (each result
///   with its own per-result threshold where [`EliderBuilder::limits`] sets one for its
///   target, else the default: with none set, [`plan`](crate::plan)). An elided one
///   becomes [`PreviewConfig::preview`] of its readable text followed by
///   [`placeholders_not_shown`] (so an elided result keeps its placeholders: the model still
///   learns every image or resource it held); when the preview would not be shorter, an
///   elided result with binary blocks becomes its readable text (images dropped, their
///   placeholder lines kept), and one without stays [`Projection::Full`].
/// - A **failure** (`is_error`) is not planned: its readable text is cut to its first
///   [`PreviewConfig::failure_chars`] characters, with no marker and no guidance, whatever
///   the thresholds; a failure with binary blocks becomes that text (images dropped, their
///   placeholder lines kept) even when nothing is cut. Its kept part is small and bounded,
///   so it is left out of the batch sum.
///
/// Projection is pure and deterministic: the same batch gives the same bytes, every time,
/// on every machine.
///
/// Results are sized through the [`TokenEstimator`] seam: `E` is the crate's [`Estimator`]
/// unless [`EliderBuilder::estimator`] sets another (a tokenizer of the caller's model,
/// say). The elider is generic over it rather than holding a `dyn`, so the default costs
/// nothing over calling [`Estimator`] directly. The same estimator should size results
/// when a store records their estimates ([`StoredResult::estimate`](psych_types::StoredResult::estimate)),
/// since [`ResultProjector::project_stored`] plans with the stored figures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Elider<E = Estimator> {
    estimator: E,
    thresholds: Thresholds,
    preview: PreviewConfig,
    limits: OutputLimits,
}

impl Elider {
    /// A builder starting from the default thresholds and preview sizes, and the crate's
    /// [`Estimator`].
    pub fn builder() -> EliderBuilder {
        EliderBuilder::default()
    }
}

/// The default thresholds and preview sizes, with the crate's [`Estimator`].
impl Default for Elider {
    fn default() -> Self {
        Elider::builder().build()
    }
}

impl<E> Elider<E> {
    /// The thresholds the plan uses.
    pub fn thresholds(&self) -> &Thresholds {
        &self.thresholds
    }

    /// The preview and failure sizes.
    pub fn preview_config(&self) -> &PreviewConfig {
        &self.preview
    }

    /// The estimator sizing each result.
    pub fn estimator(&self) -> &E {
        &self.estimator
    }

    /// The limits set per server and tool ([`EliderBuilder::limits`]).
    pub fn limits(&self) -> &OutputLimits {
        &self.limits
    }

    /// This elider with `limits` instead of its own (the same estimator, thresholds and
    /// preview sizes).
    #[must_use]
    pub fn with_limits(&self, limits: OutputLimits) -> Elider<E>
    where
        E: Clone,
    {
        Elider {
            estimator: self.estimator.clone(),
            thresholds: self.thresholds,
            preview: self.preview,
            limits,
        }
    }

    /// The per-result threshold of a result of `target` ([`OutputLimits::per_result`]),
    /// the default one for a result without a target.
    fn per_result(&self, target: Option<&ToolRef>) -> u64 {
        target.map_or(self.thresholds.per_result(), |tool| {
            self.limits.per_result(
                tool,
                self.thresholds.per_result(),
                self.thresholds.per_batch(),
            )
        })
    }

    /// The preview sizes of a result of `target`: its limit's head and tail where set.
    fn preview_for(&self, target: Option<&ToolRef>) -> PreviewConfig {
        let Some(limit) = target.map(|tool| self.limits.for_tool(tool)) else {
            return self.preview;
        };
        if limit.head_chars.is_none() && limit.tail_chars.is_none() {
            return self.preview;
        }
        PreviewConfig::builder()
            .head_chars(limit.head_chars.unwrap_or(self.preview.head_chars()))
            .tail_chars(limit.tail_chars.unwrap_or(self.preview.tail_chars()))
            .failure_chars(self.preview.failure_chars())
            .build()
    }
}

/// Builds an [`Elider`]. Every part is valid by construction ([`Thresholds`] are checked
/// when they are built), so [`EliderBuilder::build`] cannot fail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EliderBuilder<E = Estimator> {
    estimator: E,
    thresholds: Thresholds,
    preview: PreviewConfig,
    limits: OutputLimits,
}

/// The default thresholds and preview sizes, with the crate's [`Estimator`].
impl Default for EliderBuilder {
    fn default() -> Self {
        Self {
            estimator: Estimator,
            thresholds: Thresholds::default(),
            preview: PreviewConfig::default(),
            limits: OutputLimits::default(),
        }
    }
}

impl<E> EliderBuilder<E> {
    /// Sizes results with `estimator` instead of the crate's [`Estimator`]. It is a
    /// threshold trigger like ours: it must be deterministic (the same batch must give the
    /// same views) and should not fall when a result grows; it is never a meter.
    pub fn estimator<F: TokenEstimator>(self, estimator: F) -> EliderBuilder<F> {
        EliderBuilder {
            estimator,
            thresholds: self.thresholds,
            preview: self.preview,
            limits: self.limits,
        }
    }

    /// Sets the thresholds of the plan.
    pub fn thresholds(mut self, thresholds: Thresholds) -> Self {
        self.thresholds = thresholds;
        self
    }

    /// Sets the preview and failure sizes.
    pub fn preview(mut self, preview: PreviewConfig) -> Self {
        self.preview = preview;
        self
    }

    /// Output limits per server and tool: a result whose target
    /// ([`ResultRef::target`], [`StoredResult::target`](psych_types::StoredResult::target))
    /// has a per-result threshold is planned with it instead of the default one (the batch
    /// threshold stays one; a hint's threshold is clamped to it), and its preview shows the
    /// head and tail set for it. The caller checks the user's thresholds against the batch
    /// threshold when it loads them ([`OutputLimits::check`]).
    pub fn limits(mut self, limits: OutputLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The elider.
    pub fn build(self) -> Elider<E> {
        Elider {
            estimator: self.estimator,
            thresholds: self.thresholds,
            preview: self.preview,
            limits: self.limits,
        }
    }
}

/// The most placeholder lines [`placeholders_not_shown`] lists; further ones are counted.
pub const MAX_LISTED_PLACEHOLDERS: usize = 20;

/// The placeholder lines of `output`'s non-text blocks that `preview` does not show whole,
/// as a paragraph to append to it (empty when there are none): a heading line, then one
/// placeholder a line, at most [`MAX_LISTED_PLACEHOLDERS`], then a count of the rest.
pub fn placeholders_not_shown(output: &ToolOutput, preview: &str) -> String {
    lines_not_shown(&BlockLines::of(output).placeholders, preview)
}

/// What [`placeholders_not_shown`] appends, given the result's placeholder `lines`.
fn lines_not_shown(lines: &[String], preview: &str) -> String {
    let missing: Vec<&String> = lines
        .iter()
        .filter(|line| !preview.contains(line.as_str()))
        .collect();
    if missing.is_empty() {
        return String::new();
    }
    let mut out = String::from("Content blocks of this result not in the preview:\n");
    for line in missing.iter().take(MAX_LISTED_PLACEHOLDERS) {
        out.push_str(line);
        out.push('\n');
    }
    if missing.len() > MAX_LISTED_PLACEHOLDERS {
        out.push_str(&format!(
            "[… and {} more content blocks]\n",
            missing.len() - MAX_LISTED_PLACEHOLDERS
        ));
    }
    out
}

impl<E: TokenEstimator> ResultProjector for Elider<E> {
    fn project(&self, batch: &[ResultRef<'_>]) -> Vec<Projection> {
        let mut out = vec![Projection::Full; batch.len()];
        // Planned results: (index in batch, readable text).
        let mut planned: Vec<(usize, Cow<'_, str>)> = Vec::with_capacity(batch.len());
        let mut sizes = Vec::with_capacity(batch.len());
        let mut per_result = Vec::with_capacity(batch.len());
        for (i, (result, slot)) in batch.iter().zip(out.iter_mut()).enumerate() {
            let text = result.output.readable_text();
            if result.output.is_error {
                let has_binary = result.output.binary_blocks().next().is_some();
                *slot = self.failure_view(&text, text.len() as u64, has_binary);
            } else {
                sizes.push(self.estimator.estimate_output(result.output));
                per_result.push(self.per_result(result.target));
                planned.push((i, text));
            }
        }
        let plan = plan_each(&sizes, &per_result, self.thresholds.per_batch());
        for (k, (i, text)) in planned.iter().enumerate() {
            if !plan.is_elided(k) {
                continue;
            }
            let result = &batch[*i];
            let preview = self.preview_for(result.target);
            let view = self.elided_view(&preview, text, result.output, result.handle);
            if let Some(slot) = out.get_mut(*i) {
                *slot = view;
            }
        }
        out
    }

    /// The views [`project`](ResultProjector::project) gives, from the stored summaries:
    /// each estimate is the stored one (computed from the output, read whole, when a
    /// record has none); a failure reads [`PreviewConfig::failure_window`] bytes; an
    /// elided result whose readable text is all it holds reads
    /// [`PreviewConfig::head_window`] bytes from its start and
    /// [`PreviewConfig::tail_window`] from its end (its line breaks are counted, reading
    /// it through once, only when the store has no count), and, when it has blocks other
    /// than text, their lines from the store ([`OutputAccess::block_lines`]), not the
    /// blocks; a result kept whole is read only by the caller, to send it.
    fn project_stored(
        &self,
        batch: &[StoredRef<'_>],
        source: &dyn OutputAccess,
    ) -> Result<Vec<Projection>, SourceError> {
        let mut out = vec![Projection::Full; batch.len()];
        let mut loaded: Vec<Option<ToolOutput>> = vec![None; batch.len()];
        let mut planned = Vec::with_capacity(batch.len());
        let mut sizes = Vec::with_capacity(batch.len());
        let mut per_result = Vec::with_capacity(batch.len());
        for (i, item) in batch.iter().enumerate() {
            let info = &item.stored.info;
            if info.is_error {
                let window = read_text(
                    source,
                    item.handle,
                    0,
                    self.preview.failure_window(),
                    info.len,
                )?;
                // Only a failure with other blocks than text can hold binary data: the
                // store's lines of its blocks say whether it does.
                let has_binary = !item.stored.text_only
                    && source
                        .block_lines(item.handle)?
                        .is_some_and(|blocks| blocks.has_binary);
                if let Some(slot) = out.get_mut(i) {
                    *slot = self.failure_view(&window, info.len, has_binary);
                }
                continue;
            }
            let size = match item.stored.estimate {
                Some(estimate) => estimate,
                None => {
                    // Stored without an estimate: it needs the output, read whole.
                    let output = load_whole(source, item.handle)?;
                    let estimate = self.estimator.estimate_output(&output);
                    loaded[i] = Some(output);
                    estimate
                }
            };
            sizes.push(size);
            per_result.push(self.per_result(item.stored.target.as_ref()));
            planned.push(i);
        }
        let plan = plan_each(&sizes, &per_result, self.thresholds.per_batch());
        for (k, &i) in planned.iter().enumerate() {
            if !plan.is_elided(k) {
                continue;
            }
            let item = &batch[i];
            let preview = self.preview_for(item.stored.target.as_ref());
            let view = match &loaded[i] {
                Some(output) => {
                    self.elided_view(&preview, &output.readable_text(), output, item.handle)
                }
                None => {
                    // A result with other blocks: its preview lists them, from what the
                    // store keeps of their shapes (its text is read by windows all the same).
                    let blocks = if item.stored.text_only {
                        None
                    } else {
                        Some(
                            source
                                .block_lines(item.handle)?
                                .ok_or_else(|| SourceError {
                                    handle: item.handle.clone(),
                                    source: "the handle does not resolve to a tool result".into(),
                                })?,
                        )
                    };
                    stored_preview(&preview, item, blocks.as_ref(), source)?
                }
            };
            if let Some(slot) = out.get_mut(i) {
                *slot = view;
            }
        }
        Ok(out)
    }
}

impl<E> Elider<E> {
    /// The view of a failure whose readable text (`len` bytes) starts with `text`: whole
    /// when truncating keeps all of it and it holds no binary data (`has_binary`: an image,
    /// audio or a blob resource, which a failure never sends: its readable text names it).
    fn failure_view(&self, text: &str, len: u64, has_binary: bool) -> Projection {
        let kept = self.preview.truncate_failure(text);
        if kept.len() as u64 == len && !has_binary {
            Projection::Full
        } else {
            Projection::Replaced(kept.to_owned())
        }
    }

    /// The view of an elided success whose readable text is `text`, with `preview`'s sizes.
    fn elided_view(
        &self,
        preview: &PreviewConfig,
        text: &str,
        output: &ToolOutput,
        handle: &RecordHandle,
    ) -> Projection {
        let has_binary = output.binary_blocks().next().is_some();
        match preview.preview(text, handle) {
            Cow::Owned(mut preview) => {
                preview.push_str(&placeholders_not_shown(output, &preview));
                Projection::Replaced(preview)
            }
            Cow::Borrowed(_) if has_binary => Projection::Replaced(text.to_owned()),
            Cow::Borrowed(_) => Projection::Full,
        }
    }
}

/// The view of an elided success from its windows (with `preview`'s sizes), with `blocks`,
/// its blocks other than text, when it has any: the same bytes [`Elider::elided_view`]
/// makes from the whole result.
fn stored_preview(
    preview: &PreviewConfig,
    item: &StoredRef<'_>,
    blocks: Option<&BlockLines>,
    source: &dyn OutputAccess,
) -> Result<Projection, SourceError> {
    let len = item.stored.info.len;
    let (head_window, tail_window) = (preview.head_window(), preview.tail_window());
    let whole;
    let tail_text;
    let windows = if len <= head_window.saturating_add(tail_window) as u64 {
        whole = read_text(
            source,
            item.handle,
            0,
            head_window.saturating_add(tail_window),
            len,
        )?;
        preview.windows_of(&whole)
    } else {
        let breaks = match item.stored.line_breaks {
            Some(breaks) => breaks,
            None => count_stored_breaks(source, item.handle, len)?,
        };
        whole = read_text(source, item.handle, 0, head_window, len)?;
        let from = len - tail_window as u64;
        let (skipped, text) = read_tail(source, item.handle, from, tail_window)?;
        tail_text = text;
        Windows {
            head: &whole,
            tail: &tail_text,
            tail_at: from + skipped as u64,
            len,
            breaks,
        }
    };
    let whole_read = len <= head_window.saturating_add(tail_window) as u64;
    Ok(
        match (preview.preview_windows(&windows, item.handle), blocks) {
            (Some(mut preview), Some(blocks)) => {
                preview.push_str(&lines_not_shown(&blocks.placeholders, &preview));
                Projection::Replaced(preview)
            }
            (Some(preview), None) => Projection::Replaced(preview),
            // Binary data is not sent whole even when a preview would not be shorter: the
            // readable text instead. Past both windows a preview is not shorter only when
            // the text is no longer than the preview itself (the windows cannot meet), so
            // reading it whole stays within that.
            (None, Some(blocks)) if blocks.has_binary => Projection::Replaced(if whole_read {
                whole.clone()
            } else {
                let n = usize::try_from(len).unwrap_or(usize::MAX);
                read_text(source, item.handle, 0, n, len)?
            }),
            (None, _) => Projection::Full,
        },
    )
}

/// Up to `max` bytes of readable text from `offset` (a result of `len` bytes), cut back to
/// whole characters.
fn read_text(
    source: &dyn OutputAccess,
    handle: &RecordHandle,
    offset: u64,
    max: usize,
    len: u64,
) -> Result<String, SourceError> {
    let n = usize::try_from(len.saturating_sub(offset)).map_or(max, |left| left.min(max));
    let mut buf = vec![0u8; n];
    let got = read_exact_output(source, handle, offset, &mut buf)?;
    buf.truncate(got);
    match String::from_utf8(buf) {
        Ok(text) => Ok(text),
        Err(error) => {
            let valid = error.utf8_error().valid_up_to();
            // Only an incomplete character at the window's end is cut; anything else is
            // not the UTF-8 a store keeps.
            if error.utf8_error().error_len().is_some() {
                return Err(not_utf8(handle));
            }
            let mut bytes = error.into_bytes();
            bytes.truncate(valid);
            String::from_utf8(bytes).map_err(|_| not_utf8(handle))
        }
    }
}

/// The readable text from byte `from` to its end (`max` bytes), without the continuation
/// bytes of a character begun before `from`: how many bytes were skipped, and the text.
fn read_tail(
    source: &dyn OutputAccess,
    handle: &RecordHandle,
    from: u64,
    max: usize,
) -> Result<(usize, String), SourceError> {
    let mut buf = vec![0u8; max];
    let got = read_exact_output(source, handle, from, &mut buf)?;
    buf.truncate(got);
    let skipped = buf
        .iter()
        .take(3)
        .take_while(|&&b| b & 0xC0 == 0x80)
        .count();
    buf.drain(..skipped);
    String::from_utf8(buf)
        .map(|text| (skipped, text))
        .map_err(|_| not_utf8(handle))
}

/// Line breaks in a stored result's readable text, read through in pieces.
fn count_stored_breaks(
    source: &dyn OutputAccess,
    handle: &RecordHandle,
    len: u64,
) -> Result<u64, SourceError> {
    let mut buf = vec![0u8; 1 << 20];
    let (mut offset, mut breaks) = (0u64, 0u64);
    while offset < len {
        let n = source.read_output(handle, offset, &mut buf)?;
        if n == 0 {
            break;
        }
        breaks += psych_types::count_line_breaks(&buf[..n]);
        offset += n as u64;
    }
    Ok(breaks)
}

fn not_utf8(handle: &RecordHandle) -> SourceError {
    SourceError {
        handle: handle.clone(),
        source: "the stored readable text is not UTF-8".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use psych_types::{ContentBlock, RecordHandle, RunId, ToolOutput};

    fn handles(n: usize) -> Vec<RecordHandle> {
        let run = RunId::new("run-1").unwrap();
        (0..n)
            .map(|i| RecordHandle::new(run.clone(), i as u64 * 2 + 1))
            .collect()
    }

    fn project(elider: &Elider, outputs: &[ToolOutput]) -> Vec<Projection> {
        let handles = handles(outputs.len());
        let batch: Vec<ResultRef<'_>> = handles
            .iter()
            .zip(outputs)
            .map(|(handle, output)| ResultRef {
                handle,
                output,
                target: None,
            })
            .collect();
        let out = elider.project(&batch);
        assert_eq!(out.len(), batch.len(), "one view per result");
        out
    }

    fn small_elider() -> Elider {
        Elider::builder()
            .thresholds(
                Thresholds::builder()
                    .per_result(100)
                    .per_batch(300)
                    .build()
                    .unwrap(),
            )
            .preview(
                PreviewConfig::builder()
                    .head_chars(20)
                    .tail_chars(10)
                    .failure_chars(30)
                    .build(),
            )
            .build()
    }

    /// A tool limited below the default elides what another tool shows whole, with its
    /// own preview sizes; one raised above it keeps whole what the default elides; the
    /// stored path gives the same bytes as the whole one.
    #[test]
    fn output_limits_apply_per_tool_on_both_paths() {
        use psych_types::{
            HistoryItem, MemoryRecords, OutputLimit, OutputLimits, Record, ServerId, StoredRef,
            ToolCallId, ToolName, ToolResult,
        };
        let tool =
            |name: &str| ToolRef::new(ServerId::new("s").unwrap(), ToolName::new(name).unwrap());
        let limits = OutputLimits::new()
            .tool(
                tool("tight"),
                OutputLimit {
                    per_result_tokens: Some(200),
                    head_chars: Some(5),
                    tail_chars: Some(0),
                },
            )
            .tool(
                tool("loose"),
                OutputLimit {
                    per_result_tokens: Some(2_000),
                    ..OutputLimit::default()
                },
            );
        let elider = Elider::builder()
            .thresholds(
                Thresholds::builder()
                    .per_result(1_000)
                    .per_batch(3_000)
                    .build()
                    .unwrap(),
            )
            .limits(limits)
            .build();
        // Under the default threshold, over the tight one.
        let text = "line of text\n".repeat(100);
        // Over the default threshold, under the loose one.
        let large = "word ".repeat(1_400);
        assert!(Estimator.estimate_text(&text) > 200 && Estimator.estimate_text(&text) < 1_000);
        assert!(Estimator.estimate_text(&large) > 1_000 && Estimator.estimate_text(&large) < 2_000);
        let mut log = MemoryRecords::new(RunId::new("run-1").unwrap());
        let mut push = |name: &str, target: Option<ToolRef>, text: &str| {
            log.push(Record::ToolResult(ToolResult {
                call_id: ToolCallId::new(format!("c-{name}")).unwrap(),
                name: name.into(),
                output: ToolOutput::text(text),
                target,
            }))
        };
        let handles = [
            push("tight", Some(tool("tight")), &text),
            push("other", Some(tool("other")), &text),
            push("none", None, &text),
            push("loose", Some(tool("loose")), &large),
            push("default", Some(tool("other")), &large),
        ];
        let records = log.records();
        let whole: Vec<ResultRef<'_>> = records
            .iter()
            .map(|logged| match &logged.record {
                Record::ToolResult(result) => ResultRef {
                    handle: &logged.handle,
                    output: &result.output,
                    target: result.target.as_ref(),
                },
                _ => unreachable!(),
            })
            .collect();
        let views = elider.project(&whole);
        let Projection::Replaced(tight) = &views[0] else {
            panic!("the tight tool's result is elided: {views:?}")
        };
        assert!(
            tight.starts_with("lin") && !tight.starts_with("line of text"),
            "{tight}"
        );
        assert!(
            !tight.contains("line of text\nline of text"),
            "a 5-character head: {tight}"
        );
        assert_eq!(views[1], Projection::Full);
        assert_eq!(views[2], Projection::Full);
        // A raised threshold keeps whole what the default elides.
        assert_eq!(views[3], Projection::Full);
        assert!(matches!(views[4], Projection::Replaced(_)), "{views:?}");

        let history = psych_types::History::from_records(&records, Some(&Estimator));
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
        assert_eq!(stored.len(), handles.len());
        assert_eq!(elider.project_stored(&stored, &log).unwrap(), views);
    }

    #[test]
    fn elides_large_successes_truncates_failures_keeps_the_rest() {
        let big = "word ".repeat(1000);
        let outputs = [
            ToolOutput::text("small and fine"),
            ToolOutput::text(big.clone()),
            ToolOutput::error(format!("Error: boom\n{}", "  at frame\n".repeat(50))),
            ToolOutput::error("short failure"),
            ToolOutput::from_blocks(vec![ContentBlock::image("image/png", vec![7; 5000])]),
            ToolOutput::from_blocks(vec![ContentBlock::image("image/png", vec![7; 30])]),
        ];
        let out = project(&small_elider(), &outputs);
        assert_eq!(out[0], Projection::Full);
        let Projection::Replaced(preview) = &out[1] else {
            panic!("{:?}", out[1])
        };
        assert!(
            preview.starts_with("word word word word \n[… "),
            "{preview}"
        );
        assert!(preview.contains("handle \"run-1:3\""), "{preview}");
        assert_eq!(
            out[2],
            Projection::Replaced("Error: boom\n  at frame\n  at fr".into())
        );
        assert_eq!(out[3], Projection::Full);
        assert_eq!(
            out[4],
            Projection::Replaced("[content block #0: image, image/png, 5000 bytes]".into())
        );
        assert_eq!(out[5], Projection::Full);
        assert_eq!(out, project(&small_elider(), &outputs), "deterministic");
    }

    /// A failure never sends binary data, however short its text (a browser tool's
    /// screenshot with its error): its readable text, which names the block, instead.
    #[test]
    fn a_short_failure_with_an_image_is_sent_as_its_text() {
        let mut failed = ToolOutput::from_blocks(vec![
            ContentBlock::text("Error: timeout"),
            ContentBlock::image("image/png", vec![7; 3_000]),
        ]);
        failed.is_error = true;
        let out = project(
            &Elider::default(),
            &[failed.clone(), ToolOutput::error("Error: timeout")],
        );
        assert_eq!(
            out[0],
            Projection::Replaced(failed.readable_text().into_owned())
        );
        assert!(
            failed.readable_text().contains("image/png, 3000 bytes]"),
            "{}",
            failed.readable_text()
        );
        assert_eq!(out[1], Projection::Full);
    }

    /// Sizes every output by a fixed figure, through `estimate_output` alone: its text
    /// and binary estimates would keep everything.
    struct Fixed(u64);

    impl TokenEstimator for Fixed {
        fn estimate_text(&self, _text: &str) -> u64 {
            0
        }
        fn estimate_binary(&self, _mime_type: &str, _len: u64) -> u64 {
            0
        }
        fn estimate_output(&self, _output: &ToolOutput) -> u64 {
            self.0
        }
    }

    #[test]
    fn results_are_sized_through_the_estimator_seam() {
        let thresholds = Thresholds::builder()
            .per_result(1_000)
            .per_batch(3_000)
            .build()
            .unwrap();
        let config = Elider::builder()
            .thresholds(thresholds)
            .preview(*small_elider().preview_config())
            .build();
        let with = |estimator: Fixed| {
            Elider::builder()
                .estimator(estimator)
                .thresholds(thresholds)
                .preview(*config.preview_config())
                .build()
        };
        let text = "line of a result\n".repeat(40);
        let outputs = [
            ToolOutput::text(text.clone()),
            ToolOutput::error(text.clone()),
        ];
        let handles = handles(2);
        let batch: Vec<ResultRef<'_>> = handles
            .iter()
            .zip(&outputs)
            .map(|(handle, output)| ResultRef {
                handle,
                output,
                target: None,
            })
            .collect();
        // Our estimator finds the success small and keeps it whole.
        assert_eq!(config.project(&batch)[0], Projection::Full);
        // Sized over the per-result threshold by the caller's estimator, it is elided; the
        // failure is truncated whatever the estimate, as with ours.
        let huge = with(Fixed(1_000)).project(&batch);
        assert!(matches!(&huge[0], Projection::Replaced(p) if p.contains("read_tool_output")));
        assert_eq!(huge[1], config.project(&batch)[1]);
        assert_eq!(with(Fixed(999)).project(&batch), config.project(&batch));
    }

    #[test]
    fn json_is_previewed_through_its_pretty_text_view() {
        let items: Vec<_> = (0..300)
            .map(|i| serde_json::json!({"id": i, "name": format!("item-{i}")}))
            .collect();
        let value = serde_json::json!({ "items": items });
        let out = project(&small_elider(), &[ToolOutput::json(value)]);
        let Projection::Replaced(preview) = &out[0] else {
            panic!("{:?}", out[0])
        };
        assert!(
            preview.starts_with("{\n  \"items\": [\n[… lines 3-"),
            "{preview}"
        );
    }

    #[test]
    fn an_elided_mixed_result_keeps_every_placeholder() {
        let mut blocks = vec![ContentBlock::text("head ".repeat(200))];
        for i in 0..25 {
            blocks.push(ContentBlock::image("image/png", vec![i; 40]));
        }
        blocks.push(ContentBlock::text("tail ".repeat(200)));
        let out = project(&small_elider(), &[ToolOutput::from_blocks(blocks)]);
        let Projection::Replaced(preview) = &out[0] else {
            panic!("{:?}", out[0])
        };
        assert!(
            preview
                .contains("not in the preview:\n[content block #1: image, image/png, 40 bytes]\n"),
            "{preview}"
        );
        assert!(preview.contains("[content block #20: image"), "{preview}");
        assert!(!preview.contains("[content block #21: image"), "{preview}");
        assert!(
            preview.ends_with("[… and 5 more content blocks]\n"),
            "{preview}"
        );
    }
}
