//! Psych's ranking of every query of the search evaluation set (`tests/search_eval/`), as
//! JSON: `{"<query>": [[server, tool, score], ...]}`, the top 200 of each, over the same
//! 3,101 tools the scorer indexes. Input to `tests/search_eval/embeddings/fuse.py`, which
//! measures Psych's ranking fused with an embedding model's.
//!
//! ```sh
//! cargo run --release -p psych-disclosure --example search_ranks -- ranks.json
//! ```

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a measurement tool fails loudly on bad data"
)]

use std::collections::BTreeMap;
use std::path::PathBuf;

use psych_disclosure::SearchIndex;
use psych_types::{ServerId, ToolDefinition, ToolList};
use serde_json::{Value, json};

/// The fixtures, under the server names the scorer connects them as.
const FIXTURES: [(&str, &str); 5] = [
    ("github", "github.tools.json"),
    ("notion", "notion.tools.json"),
    ("playwright", "playwright.tools.json"),
    ("filesystem", "server-filesystem.tools.json"),
    ("memory", "server-memory.tools.json"),
];

fn main() {
    let out = std::env::args()
        .nth(1)
        .expect("usage: search_ranks OUT.json");
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let eval = root.join("tests/search_eval");
    // The fixtures beside the checkout, or `$PSYCH_FIXTURES`, as the tests find them.
    let fixtures = std::env::var_os("PSYCH_FIXTURES")
        .map_or_else(|| root.join("../../shared/fixtures"), PathBuf::from)
        .join("catalogs");
    let mut files: BTreeMap<String, PathBuf> = FIXTURES
        .iter()
        .map(|(server, file)| ((*server).to_owned(), fixtures.join(file)))
        .collect();
    for entry in std::fs::read_dir(eval.join("catalogs")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        if let Some(server) = name.strip_suffix(".tools.json") {
            files.insert(server.to_owned(), path);
        }
    }
    let mut tools: Vec<(ServerId, ToolDefinition)> = Vec::new();
    for (server, path) in &files {
        let list: ToolList = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let id = ServerId::new(server.as_str()).unwrap();
        tools.extend(list.tools.into_iter().map(|tool| (id.clone(), tool)));
    }
    let index = SearchIndex::new(tools.iter().map(|(server, tool)| (server, tool)));
    let queries: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(eval.join("queries.json")).unwrap()).unwrap();
    let mut ranks = serde_json::Map::new();
    for query in queries {
        let text = query["query"].as_str().unwrap();
        let hits = index
            .search_scored(text, 200)
            .into_iter()
            .map(|(found, score)| json!([found.server.as_str(), found.tool.as_str(), score]))
            .collect();
        ranks.insert(text.to_owned(), Value::Array(hits));
    }
    let queries = ranks.len();
    std::fs::write(&out, Value::Object(ranks).to_string()).unwrap();
    eprintln!("{} tools, {queries} queries: {out}", tools.len());
}
