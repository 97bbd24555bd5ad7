//! [`Elider`], the `ResultProjector` of the workspace: estimates, plans and projects one
//! turn's tool results.

use std::borrow::Cow;

use psych_types::{OutputBody, Projection, ResultProjector, ResultRef, TokenEstimator};

use crate::{Estimator, PreviewConfig, Thresholds, plan};

/// Decides what the model sees of one turn's tool results: the elision plan over the
/// successes, head+tail previews for the elided ones, hard truncation for failures.
///
/// - A **success** (text or JSON) is estimated through its text view (JSON pretty-printed,
///   the bytes the reader tool serves) and planned with [`plan`]; an elided one becomes
///   [`PreviewConfig::preview`] of that text view, or stays [`Projection::Full`] when the
///   preview would not be shorter.
/// - A **binary** output is estimated with
///   [`TokenEstimator::estimate_binary`] and planned like any success (whatever its
///   `is_error`, since bytes cannot be truncated as text); an elided one becomes one line
///   naming its MIME type and its size in bytes.
/// - A **failure** (`is_error`, text or JSON) is not planned: it is cut to its first
///   [`PreviewConfig::failure_chars`] characters, with no marker and no guidance, whatever
///   the thresholds. Its kept part is small and bounded, so it is left out of the batch sum.
///
/// Projection is pure and deterministic: the same batch gives the same bytes, every time,
/// on every machine.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Elider {
    estimator: Estimator,
    thresholds: Thresholds,
    preview: PreviewConfig,
}

impl Elider {
    /// A builder starting from the default thresholds and preview sizes.
    pub fn builder() -> EliderBuilder {
        EliderBuilder::default()
    }

    /// The thresholds the plan uses.
    pub fn thresholds(&self) -> &Thresholds {
        &self.thresholds
    }

    /// The preview and failure sizes.
    pub fn preview_config(&self) -> &PreviewConfig {
        &self.preview
    }

    /// The estimator sizing each result.
    pub fn estimator(&self) -> &Estimator {
        &self.estimator
    }
}

/// Builds an [`Elider`]. Every part is valid by construction ([`Thresholds`] are checked
/// when they are built), so [`EliderBuilder::build`] cannot fail.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EliderBuilder {
    thresholds: Thresholds,
    preview: PreviewConfig,
}

impl EliderBuilder {
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

    /// The elider.
    pub fn build(self) -> Elider {
        Elider {
            estimator: Estimator,
            thresholds: self.thresholds,
            preview: self.preview,
        }
    }
}

/// The one-line view of an elided binary output. It names no remedy: the reader tool
/// refuses to serve binary content as text, and a pointer to a tool that refuses would be
/// a false one.
fn binary_line(mime_type: &str, len: usize) -> String {
    // The MIME type comes from a server: keep the line one line.
    let mime: String = mime_type
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    format!("[Elided binary tool result: {mime}, {len} bytes; binary content is not shown.]")
}

impl ResultProjector for Elider {
    fn project(&self, batch: &[ResultRef<'_>], out: &mut [Projection]) {
        // Planned results: (index in batch, text view or None for binary).
        let mut planned: Vec<(usize, Option<Cow<'_, str>>)> = Vec::with_capacity(batch.len());
        let mut sizes = Vec::with_capacity(batch.len());
        for (i, (result, slot)) in batch.iter().zip(out.iter_mut()).enumerate() {
            match &result.output.body {
                OutputBody::Binary { mime_type, data } => {
                    sizes.push(self.estimator.estimate_binary(mime_type, data.len() as u64));
                    planned.push((i, None));
                }
                _ if result.output.is_error => {
                    let text = result.output.text_view().unwrap_or_default();
                    let kept = self.preview.truncate_failure(&text);
                    *slot = if kept.len() == text.len() {
                        Projection::Full
                    } else {
                        Projection::Replaced(kept.to_owned())
                    };
                }
                _ => {
                    let text = result.output.text_view().unwrap_or_default();
                    sizes.push(self.estimator.estimate_text(&text));
                    planned.push((i, Some(text)));
                }
            }
        }
        let plan = plan(&sizes, &self.thresholds);
        for (k, (i, text)) in planned.iter().enumerate() {
            if !plan.is_elided(k) {
                continue;
            }
            let result = &batch[*i];
            let view = match (text, &result.output.body) {
                (Some(text), _) => match self.preview.preview(text, result.handle) {
                    Cow::Owned(preview) => Projection::Replaced(preview),
                    Cow::Borrowed(_) => Projection::Full,
                },
                (None, OutputBody::Binary { mime_type, data }) => {
                    Projection::Replaced(binary_line(mime_type, data.len()))
                }
                (None, _) => Projection::Full,
            };
            if let Some(slot) = out.get_mut(*i) {
                *slot = view;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use psych_types::{RecordHandle, RunId, ToolOutput};

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
            .map(|(handle, output)| ResultRef { handle, output })
            .collect();
        let mut out = vec![Projection::Full; batch.len()];
        elider.project(&batch, &mut out);
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
            .preview(PreviewConfig {
                head_chars: 20,
                tail_chars: 10,
                failure_chars: 30,
            })
            .build()
    }

    #[test]
    fn elides_large_successes_truncates_failures_keeps_the_rest() {
        let big = "word ".repeat(1000);
        let outputs = [
            ToolOutput::text("small and fine"),
            ToolOutput::text(big.clone()),
            ToolOutput::error(format!("Error: boom\n{}", "  at frame\n".repeat(50))),
            ToolOutput::error("short failure"),
            ToolOutput::binary("image/png", vec![7; 5000]),
            ToolOutput::binary("image/png", vec![7; 30]),
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
            Projection::Replaced(
                "[Elided binary tool result: image/png, 5000 bytes; binary content is not shown.]"
                    .into()
            )
        );
        assert_eq!(out[5], Projection::Full);
        assert_eq!(out, project(&small_elider(), &outputs), "deterministic");
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
            preview.starts_with("{\n  \"items\": [\n    {\n"),
            "{preview}"
        );
    }

    #[test]
    fn a_short_out_slice_is_never_overrun() {
        let outputs = [
            ToolOutput::text("x".repeat(10_000)),
            ToolOutput::error("e".repeat(99)),
        ];
        let handles = handles(2);
        let batch: Vec<ResultRef<'_>> = handles
            .iter()
            .zip(&outputs)
            .map(|(handle, output)| ResultRef { handle, output })
            .collect();
        let mut out = vec![Projection::Full; 1];
        small_elider().project(&batch, &mut out);
        assert!(matches!(out[0], Projection::Replaced(_)));
    }

    #[test]
    fn control_characters_in_a_mime_type_stay_on_one_line() {
        let line = binary_line("image/png\nX: y", 3);
        assert!(!line.contains('\n'), "{line}");
    }
}
