//! Search quality, measured: a query set of natural-language tasks (`search_queries.json`,
//! each with the `(server, tool)` that answers it) over the five fixture catalogues searched
//! together, ranked by Psych's [`SearchIndex`] and by a plain BM25 over the same text,
//! computed in the same test. Psych's must not be worse on recall@5 or on mean reciprocal
//! rank.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use crate::common::bm25::Bm25;
use crate::common::{FIXTURES, fixture_tools};
use psych_disclosure::SearchIndex;
use psych_types::{ServerId, ToolDefinition, ToolRef};
use serde::Deserialize;

#[derive(Deserialize)]
struct Query {
    query: String,
    server: String,
    tool: String,
}

/// recall@5 and MRR of a ranking function over the query set, plus the misses at 5.
fn measure(queries: &[Query], rank: impl Fn(&str) -> Vec<ToolRef>) -> (f64, f64, Vec<String>) {
    let mut hits = 0;
    let mut reciprocal = 0.0;
    let mut misses = Vec::new();
    for q in queries {
        let expected = ToolRef::parse(&q.server, &q.tool).unwrap();
        let ranking = rank(&q.query);
        match ranking.iter().position(|t| *t == expected) {
            Some(i) => {
                reciprocal += 1.0 / (i as f64 + 1.0);
                if i < 5 {
                    hits += 1;
                } else {
                    misses.push(format!("{} -> rank {}", q.query, i + 1));
                }
            }
            None => misses.push(format!("{} -> not found", q.query)),
        }
    }
    let n = queries.len() as f64;
    (f64::from(hits) / n, reciprocal / n, misses)
}

#[test]
fn psych_ranking_is_not_worse_than_bm25() {
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/search_queries.json"),
    )
    .unwrap();
    let queries: Vec<Query> = serde_json::from_str(&text).unwrap();
    assert!(
        queries.len() >= 40,
        "the query set has {} queries",
        queries.len()
    );

    let tools: Vec<(ServerId, ToolDefinition)> = FIXTURES
        .iter()
        .flat_map(|(server, file)| {
            let id = ServerId::new(*server).unwrap();
            fixture_tools(file)
                .into_iter()
                .map(move |t| (id.clone(), t))
        })
        .collect();
    // Every expected answer exists in the catalogues.
    for q in &queries {
        assert!(
            tools
                .iter()
                .any(|(s, t)| s.as_str() == q.server && t.name.as_str() == q.tool),
            "{}/{} is not a fixture tool",
            q.server,
            q.tool
        );
    }
    let index = SearchIndex::new(tools.iter().map(|(s, t)| (s, t)));
    let bm25 = Bm25::new(&tools);

    let (psych_recall, psych_mrr, psych_misses) =
        measure(&queries, |q| index.search(q, tools.len()));
    let (bm25_recall, bm25_mrr, bm25_misses) = measure(&queries, |q| bm25.search(q));
    println!(
        "search quality over {} queries, {} tools of {} servers:",
        queries.len(),
        tools.len(),
        FIXTURES.len()
    );
    println!("| ranking | recall@5 | MRR |");
    println!("| Psych (BM25F, stemmed) | {psych_recall:.3} | {psych_mrr:.3} |");
    println!("| plain BM25 | {bm25_recall:.3} | {bm25_mrr:.3} |");
    println!("Psych misses at 5: {psych_misses:#?}");
    println!("BM25 misses at 5: {bm25_misses:#?}");
    assert!(
        psych_recall >= bm25_recall,
        "recall@5 {psych_recall} < {bm25_recall}"
    );
    // Floors under the figures of the first ranking (0.824 and 0.740; the vocabulary of
    // issue 32 raised them), so a regression is seen.
    assert!(psych_recall >= 0.80, "recall@5 fell to {psych_recall}");
    assert!(psych_mrr >= 0.72, "MRR fell to {psych_mrr}");
    assert!(psych_mrr >= bm25_mrr, "MRR {psych_mrr} < {bm25_mrr}");
}

#[test]
fn ranking_is_deterministic_whatever_the_input_order() {
    let mut tools: Vec<(ServerId, ToolDefinition)> = FIXTURES
        .iter()
        .flat_map(|(server, file)| {
            let id = ServerId::new(*server).unwrap();
            fixture_tools(file)
                .into_iter()
                .map(move |t| (id.clone(), t))
        })
        .collect();
    let forward = SearchIndex::new(tools.iter().map(|(s, t)| (s, t)));
    tools.reverse();
    let backward = SearchIndex::new(tools.iter().map(|(s, t)| (s, t)));
    for query in ["list", "pull request review comment", "file", "page block"] {
        assert_eq!(
            forward.search(query, 50),
            backward.search(query, 50),
            "{query}"
        );
    }
}
