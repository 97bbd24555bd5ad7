//! The exact bytes the model sees of realistic tool results, as insta snapshots: previews
//! of results shaped like real MCP outputs (a GitHub `list_issues` JSON, a Playwright page
//! snapshot, a filesystem `directory_tree`), a truncated failure (a stack trace), an
//! elided screenshot, and small results that stay whole.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

#[allow(dead_code, reason = "these tests use the generators, not every corpus")]
use crate::corpus;

use std::fmt::Write as _;

use psych_elision::{Elider, PreviewConfig, Thresholds};
use psych_types::{
    ContentBlock, Projection, RecordHandle, ResultProjector, ResultRef, RunId, ToolOutput,
};
use serde_json::{Value, json};

fn elider() -> Elider {
    Elider::builder()
        .thresholds(
            Thresholds::builder()
                .per_result(2_000)
                .per_batch(6_000)
                .build()
                .unwrap(),
        )
        .preview(
            PreviewConfig::builder()
                .head_chars(600)
                .tail_chars(200)
                .failure_chars(400)
                .build(),
        )
        .build()
}

/// Projects `outputs` as one batch (handles `run-42:1`, `run-42:3`, …) and renders each
/// slot: `FULL (n bytes)` or the replacement text, exactly.
fn check(outputs: &[ToolOutput]) -> String {
    let run = RunId::new("run-42").unwrap();
    let handles: Vec<RecordHandle> = (0..outputs.len() as u64)
        .map(|i| RecordHandle::new(run.clone(), 2 * i + 1))
        .collect();
    let batch: Vec<ResultRef<'_>> = handles
        .iter()
        .zip(outputs)
        .map(|(handle, output)| ResultRef {
            handle,
            output,
            target: None,
        })
        .collect();
    let out = elider().project(&batch);
    assert_eq!(out.len(), batch.len(), "one view per result");
    let mut rendered = String::new();
    for (i, (projection, output)) in out.iter().zip(outputs).enumerate() {
        let len = psych_types::readable_bytes(output).len();
        match projection {
            Projection::Full => writeln!(rendered, "=== result {i}: FULL ({len} bytes)").unwrap(),
            Projection::Replaced(text) => {
                writeln!(
                    rendered,
                    "=== result {i}: REPLACED ({len} -> {} bytes)",
                    text.len()
                )
                .unwrap();
                rendered.push_str(text);
                rendered.push('\n');
            }
        }
    }
    rendered
}

fn playwright_snapshot() -> String {
    let mut text = String::from(
        "### Ran Playwright code\n```js\nawait page.goto('https://shop.example.com/catalog?page=2');\n```\n\n\
         ### Page state\n- Page URL: https://shop.example.com/catalog?page=2\n- Page Title: Catalog – page 2 | Example Shop\n\
         - Page Snapshot:\n```yaml\n- generic [ref=e1]:\n  - banner [ref=e2]:\n    - link \"Example Shop\" [ref=e3] [cursor=pointer]:\n      - /url: /\n\
         \x20   - navigation \"Main\" [ref=e4]:\n      - list [ref=e5]:\n",
    );
    let mut rng = corpus::Rng(11);
    for i in 0..120 {
        let e = 10 + i * 4;
        let price = 5 + rng.below(300);
        writeln!(
            text,
            "        - listitem [ref=e{e}]:\n          - link \"Product {i}: {} {}\" [ref=e{}] [cursor=pointer]:\n            - /url: /p/{}\n          - text: ${price}.99",
            rng.pick(&["Walnut", "Steel", "Linen", "Ceramic"]),
            rng.pick(&["desk lamp", "mug", "throw", "shelf"]),
            e + 1,
            rng.hex(8),
        )
        .unwrap();
    }
    text.push_str(
        "  - contentinfo [ref=e999]:\n    - paragraph [ref=e1000]: © 2026 Example Shop\n```\n",
    );
    text
}

fn directory_tree(rng: &mut corpus::Rng, depth: u32, name: &str) -> Value {
    if depth == 0 {
        return json!({"name": name, "type": "file"});
    }
    let children: Vec<Value> = (0..3 + rng.below(4))
        .map(|i| {
            let stem = rng.pick(&["src", "lib", "test", "docs", "assets"]);
            let child = format!("{stem}_{i}{}", if depth == 1 { ".rs" } else { "" });
            let next = if rng.below(4) == 0 { 0 } else { depth - 1 };
            directory_tree(rng, next, &child)
        })
        .collect();
    json!({"name": name, "type": "directory", "children": children})
}

fn stack_trace() -> String {
    let mut text = String::from(
        "Error: MCP error -32603: Internal error: request to https://api.github.com/repos/acme/psych/issues failed\n\
         TypeError: Cannot read properties of undefined (reading 'nodes')\n",
    );
    for (i, frame) in [
        "listIssues (/app/node_modules/@github/mcp/dist/tools/issues.js:214:37)",
        "async Server.handleCall (/app/node_modules/@modelcontextprotocol/sdk/dist/server/index.js:412:22)",
        "async Protocol._onrequest (/app/node_modules/@modelcontextprotocol/sdk/dist/shared/protocol.js:318:31)",
    ]
    .iter()
    .cycle()
    .take(30)
    .enumerate()
    {
        writeln!(text, "    at {frame} [frame {i}]").unwrap();
    }
    text
}

#[test]
fn github_list_issues_json_preview() {
    let mut rng = corpus::Rng(3);
    let issues = corpus::github_issues(&mut rng, 25);
    insta::assert_snapshot!("github_list_issues", check(&[ToolOutput::json(issues)]));
}

#[test]
fn playwright_page_snapshot_preview() {
    insta::assert_snapshot!(
        "playwright_snapshot",
        check(&[ToolOutput::text(playwright_snapshot())])
    );
}

#[test]
fn filesystem_directory_tree_preview() {
    let mut rng = corpus::Rng(5);
    let tree = directory_tree(&mut rng, 4, "psych");
    insta::assert_snapshot!("directory_tree", check(&[ToolOutput::json(tree)]));
}

#[test]
fn stack_trace_failure_is_cut_from_the_top() {
    insta::assert_snapshot!(
        "stack_trace_failure",
        check(&[ToolOutput::error(stack_trace())])
    );
}

#[test]
fn a_mixed_batch_elides_the_largest_and_keeps_the_small() {
    // Five middling results (each under the per-result threshold) that together go over
    // the batch threshold, a screenshot, a short failure and a small answer.
    let mut rng = corpus::Rng(9);
    let mut outputs: Vec<ToolOutput> = (0..5)
        .map(|i| ToolOutput::json(corpus::github_commits(&mut rng, 2 + i)))
        .collect();
    outputs.push(ToolOutput::from_blocks(vec![
        ContentBlock::text("Screenshot of https://example.com:"),
        ContentBlock::image("image/png", rng.bytes(40_000)),
    ]));
    outputs.push(ToolOutput::error(
        "Error: ENOENT: no such file or directory, open '/srv/app/config.toml'",
    ));
    outputs.push(ToolOutput::text("Successfully wrote to /srv/app/notes.md"));
    insta::assert_snapshot!("mixed_batch", check(&outputs));
}
