//! The evaluation set of issue 32: paraphrased queries (`search_eval/queries.json`) over the
//! five fixture catalogues and the twelve captured from registry packages
//! (`search_eval/catalogs`, provenance in `search_eval/README.md`), every server indexed
//! together. Scores recall@1, recall@5 and MRR of Psych's [`SearchIndex`] and of plain BM25
//! over name + description, per split, overall and per server, and prints them
//! (`cargo test -p psych-disclosure --test it search_eval -- --nocapture`).
//!
//! It asserts what holds of the data (the set's size, that every answer exists, the split
//! rule), the exact-name guarantee over every tool, and on the test split floors just under
//! the landed figures and never below plain BM25 on a server of 20+ tools. The issue's
//! targets (recall@5 ≥ 0.95, recall@1 ≥ 0.85) are measured here, not met yet. Misses are
//! printed for the dev split only: the test split is for the final figures.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use crate::common::bm25::{Bm25, name_and_description};
use crate::common::{FIXTURES, catalogs_dir};
use psych_disclosure::SearchIndex;
use psych_types::{ServerId, ToolDefinition, ToolList, ToolRef};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Query {
    query: String,
    server: String,
    tool: String,
    split: String,
}

const SPLITS: [&str; 2] = ["dev", "test"];

fn eval_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/search_eval")
}

fn queries() -> Vec<Query> {
    let text = std::fs::read_to_string(eval_dir().join("queries.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn read_tools(path: &std::path::Path) -> Vec<ToolDefinition> {
    let text = std::fs::read_to_string(path).unwrap();
    let list: ToolList = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not a tool list: {e}", path.display()));
    list.tools
}

/// Every server's tools, sorted by `(server, tool)`: the fixtures under the names they are
/// connected as, each captured catalogue under its file name.
fn catalogues() -> Vec<(ServerId, ToolDefinition)> {
    let mut files: BTreeMap<String, PathBuf> = FIXTURES
        .iter()
        .map(|(server, file)| (server.to_string(), catalogs_dir().join(file)))
        .collect();
    for entry in std::fs::read_dir(eval_dir().join("catalogs")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap();
        if let Some(server) = name.strip_suffix(".tools.json") {
            let clash = files.insert(server.to_owned(), path.clone());
            assert!(clash.is_none(), "two catalogues are named {server}");
        }
    }
    let mut tools: Vec<(ServerId, ToolDefinition)> = files
        .iter()
        .flat_map(|(server, path)| {
            let id = ServerId::new(server.as_str()).unwrap();
            read_tools(path).into_iter().map(move |t| (id.clone(), t))
        })
        .collect();
    tools.sort_by(|a, b| (&a.0, &a.1.name).cmp(&(&b.0, &b.1.name)));
    tools
}

/// Recall@1, recall@5 and reciprocal rank summed over some queries.
#[derive(Default, Clone, Copy)]
struct Scores {
    queries: u32,
    at1: u32,
    at5: u32,
    reciprocal: f64,
}

impl Scores {
    /// `rank` is 0-based; `None` when the tool is not in the ranking at all.
    fn add(&mut self, rank: Option<usize>) {
        self.queries += 1;
        if let Some(rank) = rank {
            self.at1 += u32::from(rank == 0);
            self.at5 += u32::from(rank < 5);
            self.reciprocal += 1.0 / (rank as f64 + 1.0);
        }
    }

    fn recall1(&self) -> f64 {
        f64::from(self.at1) / f64::from(self.queries)
    }

    fn recall5(&self) -> f64 {
        f64::from(self.at5) / f64::from(self.queries)
    }

    fn mrr(&self) -> f64 {
        self.reciprocal / f64::from(self.queries)
    }
}

/// One ranking's scores over one split: overall and per server, and the misses at 5.
struct Measured {
    overall: Scores,
    servers: BTreeMap<String, Scores>,
    misses: Vec<String>,
}

fn measure<'q>(
    queries: impl IntoIterator<Item = &'q Query>,
    rank: impl Fn(&str) -> Vec<ToolRef>,
) -> Measured {
    let mut measured = Measured {
        overall: Scores::default(),
        servers: BTreeMap::new(),
        misses: Vec::new(),
    };
    for q in queries {
        let expected = ToolRef::parse(&q.server, &q.tool).unwrap();
        let ranking = rank(&q.query);
        let position = ranking.iter().position(|t| *t == expected);
        measured.overall.add(position);
        measured
            .servers
            .entry(q.server.clone())
            .or_default()
            .add(position);
        if position.is_none_or(|p| p >= 5) {
            let found = position.map_or("not found".to_owned(), |p| format!("rank {}", p + 1));
            let top = ranking
                .first()
                .map_or("nothing".to_owned(), ToString::to_string);
            measured.misses.push(format!(
                "{:?} -> {}/{}: {found}; first {top}",
                q.query, q.server, q.tool
            ));
        }
    }
    measured
}

fn row(label: &str, tools: usize, psych: &Scores, bm25: &Scores) -> String {
    format!(
        "| {label} | {tools} | {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} |",
        psych.queries,
        psych.recall1(),
        psych.recall5(),
        psych.mrr(),
        bm25.recall1(),
        bm25.recall5(),
        bm25.mrr(),
    )
}

#[test]
fn scores_psych_and_bm25_on_both_splits() {
    let tools = catalogues();
    let queries = queries();

    // The set as the issue asks for it.
    assert!(tools.len() >= 3000, "{} tools", tools.len());
    assert!(queries.len() >= 200, "{} queries", queries.len());
    let names: BTreeSet<(&str, &str)> = tools
        .iter()
        .map(|(s, t)| (s.as_str(), t.name.as_str()))
        .collect();
    assert_eq!(names.len(), tools.len(), "a tool is listed twice");
    let mut texts = BTreeSet::new();
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for q in &queries {
        assert!(
            names.contains(&(q.server.as_str(), q.tool.as_str())),
            "{}/{} is in no catalogue",
            q.server,
            q.tool
        );
        assert!(texts.insert(q.query.as_str()), "{:?} twice", q.query);
        // The split rule of the README: alternately dev and test within each server.
        let nth = seen.entry(q.server.as_str()).or_default();
        assert_eq!(q.split, SPLITS[*nth % 2], "{:?}", q.query);
        *nth += 1;
    }
    for split in SPLITS {
        assert!(queries.iter().any(|q| q.split == split), "no {split} query");
    }

    let index = SearchIndex::new(tools.iter().map(|(s, t)| (s, t)));
    let bm25 = Bm25::over(&tools, name_and_description);
    let mut per_server: BTreeMap<&str, usize> = BTreeMap::new();
    for (server, _) in &tools {
        *per_server.entry(server.as_str()).or_default() += 1;
    }

    println!(
        "search eval: {} queries over {} tools of {} servers, searched together",
        queries.len(),
        tools.len(),
        per_server.len()
    );
    for split in SPLITS {
        let chosen: Vec<&Query> = queries.iter().filter(|q| q.split == split).collect();
        let psych = measure(chosen.iter().copied(), |q| index.search(q, tools.len()));
        let plain = measure(chosen.iter().copied(), |q| bm25.search(q));
        println!();
        println!("{split} split:");
        println!(
            "| server | tools | queries | Psych r@1 | Psych r@5 | Psych MRR | BM25 r@1 | BM25 r@5 | BM25 MRR |"
        );
        println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
        println!(
            "{}",
            row("all", tools.len(), &psych.overall, &plain.overall)
        );
        for (server, scores) in &psych.servers {
            println!(
                "{}",
                row(
                    server,
                    per_server[server.as_str()],
                    scores,
                    &plain.servers[server]
                )
            );
        }
        if split == "test" {
            // Floors just under the figures of the ranking as it landed (r@1 0.558, r@5
            // 0.855, MRR 0.689), so a regression is seen; the goal (r@1 0.85, r@5
            // 0.95) is not met yet. And never below plain BM25 on a server of 20+ tools.
            let rates = |s: &Scores| (s.recall1(), s.recall5(), s.mrr());
            let (at1, at5, mrr) = rates(&psych.overall);
            assert!(
                at1 >= 0.54 && at5 >= 0.83 && mrr >= 0.67,
                "{at1} {at5} {mrr}"
            );
            for (server, scores) in &psych.servers {
                if per_server[server.as_str()] >= 20 {
                    let (ours, theirs) = (rates(scores), rates(&plain.servers[server]));
                    assert!(
                        ours.0 >= theirs.0 && ours.1 >= theirs.1 && ours.2 >= theirs.2,
                        "{server}: {ours:?} below plain BM25's {theirs:?}"
                    );
                }
            }
        }
        // How often a paraphrase of a real tool's purpose is called weak, and how right the
        // weak answers were: the threshold should flag the misses, not the hits.
        let (mut weak, mut weak_right) = (0, 0);
        let mut strengths: Vec<(f64, bool)> = Vec::new();
        for q in &chosen {
            let ranking = index.rank(&q.query, 5);
            let right = ranking
                .hits
                .iter()
                .any(|(t, _)| t.server.as_str() == q.server && t.tool.as_str() == q.tool);
            strengths.push((ranking.strength, right));
            if ranking.is_weak() {
                weak += 1;
                weak_right += u32::from(right);
            }
        }
        println!(
            "weak answers: {weak} of {} queries, the right tool in the top 5 of {weak_right}",
            chosen.len()
        );
        if split == "dev" {
            strengths.sort_by(|a, b| a.0.total_cmp(&b.0));
            let shown: Vec<String> = strengths
                .iter()
                .map(|(s, right)| format!("{s:.2}{}", if *right { "" } else { "x" }))
                .collect();
            println!("strengths (dev; x: the right tool not in the top 5): {shown:?}");
            println!("Psych misses at 5 (dev): {:#?}", psych.misses);
            println!("BM25 misses at 5 (dev): {:#?}", plain.misses);
        }
    }
}

/// The guarantee, over every tool of every catalogue: a query that is a tool's
/// exact name, `server/tool` or `server__tool`, ranks that tool first. A bare name that
/// several servers share ranks first the tool of the least server name (`ToolRef` order).
#[test]
fn exact_names_ranked_first() {
    let tools = catalogues();
    let index = SearchIndex::new(tools.iter().map(|(s, t)| (s, t)));
    let mut first_of_name: BTreeMap<&str, &ServerId> = BTreeMap::new();
    for (server, tool) in &tools {
        // `tools` is sorted by `(server, tool)`: the first server seen is the least.
        first_of_name.entry(tool.name.as_str()).or_insert(server);
    }
    let mut not_first = Vec::new();
    for (server, tool) in &tools {
        let target = ToolRef::new(server.clone(), tool.name.clone());
        let bare = ToolRef::new(first_of_name[tool.name.as_str()].clone(), tool.name.clone());
        for (query, expected) in [
            (tool.name.to_string(), &bare),
            (format!("{server}/{}", tool.name), &target),
            (format!("{server}__{}", tool.name), &target),
        ] {
            if index.search(&query, 1).first() != Some(expected) {
                not_first.push(format!("{query:?} -> {expected}"));
            }
        }
    }
    println!(
        "exact name ranked first: {} of {} queries",
        3 * tools.len() - not_first.len(),
        3 * tools.len()
    );
    assert!(
        not_first.is_empty(),
        "not first (first 40 of {}): {:#?}",
        not_first.len(),
        not_first.iter().take(40).collect::<Vec<_>>()
    );
}
