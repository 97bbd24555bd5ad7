//! Keyword search over tools: names, titles, descriptions and parameter names, ranked by
//! BM25F (field-weighted BM25) over stemmed word tokens.
//!
//! The ranking, decided here and measured in `tests/search_quality.rs` against a plain BM25
//! over the same text:
//!
//! - Tokens: identifiers are split at `_`, `-`, `.`, spaces and lowerCamel boundaries,
//!   lowercased, and lightly stemmed (plural and `-ing`/`-ed` endings, a final `e`), so
//!   `list_pull_requests` and "pull request" meet. A short list of English function words
//!   is dropped from both sides.
//! - Fields and weights: name 3, title 2, parameter names 1.5, description 1. Each field's
//!   term frequency is normalised by the field's length against its average (b = 0.75),
//!   summed with the weights, and saturated once (k1 = 1.2), so a long description cannot
//!   outweigh a match in the name.
//! - A query that is a tool's exact name, `server/tool` or `server__tool` (ignoring ASCII
//!   case and surrounding spaces) ranks that tool first, whatever the words score. A bare
//!   name several servers share ranks them all first, by server name.
//! - Ties are broken by `(server, tool)`, so the ranking is deterministic.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use psych_types::{ServerId, ToolDefinition, ToolRef};

const K1: f64 = 1.2;
const B: f64 = 0.75;
const FIELDS: usize = 4;
const WEIGHTS: [f64; FIELDS] = [3.0, 2.0, 1.5, 1.0];

/// Words too common to tell tools apart.
const STOP_WORDS: &[&str] = &[
    "a", "an", "and", "are", "as", "at", "be", "by", "can", "do", "for", "from", "how", "i", "if",
    "in", "into", "is", "it", "its", "my", "of", "on", "or", "our", "should", "so", "some", "that",
    "the", "their", "them", "then", "there", "these", "this", "to", "use", "used", "want", "was",
    "we", "what", "when", "where", "which", "with", "would", "you", "your",
];

/// Splits text into lowercase word tokens at non-alphanumeric characters and lowerCamel
/// boundaries, dropping stop words and stemming lightly.
pub(crate) fn tokens(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut prev_lower = false;
    let flush = |word: &mut String, out: &mut Vec<String>| {
        if !word.is_empty() {
            let lower = word.to_lowercase();
            if !STOP_WORDS.contains(&lower.as_str()) {
                out.push(stem(&lower));
            }
            word.clear();
        }
    };
    for c in text.chars() {
        if c.is_alphanumeric() {
            if c.is_uppercase() && prev_lower {
                flush(&mut word, &mut out);
            }
            prev_lower = c.is_lowercase() || c.is_numeric();
            word.push(c);
        } else {
            flush(&mut word, &mut out);
            prev_lower = false;
        }
    }
    flush(&mut word, &mut out);
    out
}

/// Strips plural and common verb endings and a final `e`, the same way on both sides of a
/// match: `repositories` → `repository`, `branches` → `branch`, `starred` → `star`,
/// `created` and `create` → `creat`.
fn stem(word: &str) -> String {
    if !word.is_ascii() || word.len() <= 3 {
        return word.to_owned();
    }
    let mut stem = strip_ending(word);
    if stem.len() > 4 && stem.ends_with('e') {
        stem.pop();
    }
    stem
}

fn strip_ending(word: &str) -> String {
    let n = word.len();
    if let Some(base) = word.strip_suffix("ies")
        && n > 4
    {
        return format!("{base}y");
    }
    for suffix in ["ches", "shes", "sses", "xes"] {
        if word.ends_with(suffix) {
            return word[..n - 2].to_owned();
        }
    }
    if word.ends_with('s') && !["ss", "us", "is"].iter().any(|end| word.ends_with(end)) {
        return word[..n - 1].to_owned();
    }
    for suffix in ["ing", "ed"] {
        if let Some(base) = word.strip_suffix(suffix)
            && base.len() >= 3
        {
            let bytes = base.as_bytes();
            let last = bytes[bytes.len() - 1];
            // `starred` → `star`, `running` → `run`: undo a doubled final consonant.
            if bytes.len() >= 4 && bytes[bytes.len() - 2] == last && !b"aeiouslz".contains(&last) {
                return base[..base.len() - 1].to_owned();
            }
            return base.to_owned();
        }
    }
    word.to_owned()
}

/// Top-level parameter names of an input schema.
fn parameter_names(tool: &ToolDefinition) -> String {
    tool.input_schema
        .get("properties")
        .and_then(|p| p.as_object())
        .map(|props| props.keys().cloned().collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// One indexed tool: what it calls and its fields' lengths in tokens.
struct Doc {
    target: ToolRef,
    lengths: [u32; FIELDS],
}

/// An index over some tools: their docs, and for each token the docs holding it with its
/// count in each field. Immutable once built, so parts are shared (`Arc`) between the
/// indexes that search them together: a Surface keeps one per server and catalogue
/// version, and a search over several servers combines theirs without indexing again.
pub(crate) struct Part {
    docs: Vec<Doc>,
    postings: HashMap<String, Vec<(u32, [u32; FIELDS])>>,
    totals: [u64; FIELDS],
    /// Each tool's name, ASCII-lowercased, to the docs of that name (one a server).
    names: HashMap<String, Vec<u32>>,
}

impl Part {
    /// Indexes the given tools, in the order given.
    pub(crate) fn new<'a>(
        tools: impl IntoIterator<Item = (&'a ServerId, &'a ToolDefinition)>,
    ) -> Self {
        let mut docs = Vec::new();
        let mut postings: HashMap<String, Vec<(u32, [u32; FIELDS])>> = HashMap::new();
        let mut totals = [0u64; FIELDS];
        let mut names: HashMap<String, Vec<u32>> = HashMap::new();
        for (server, tool) in tools {
            let title = tool
                .title
                .as_deref()
                .or_else(|| tool.annotations.as_ref().and_then(|a| a.title.as_deref()))
                .unwrap_or("");
            let texts = [
                tool.name.as_str().to_owned(),
                title.to_owned(),
                parameter_names(tool),
                tool.description_or_empty().to_owned(),
            ];
            let mut counts: BTreeMap<String, [u32; FIELDS]> = BTreeMap::new();
            let mut lengths = [0u32; FIELDS];
            for (i, text) in texts.iter().enumerate() {
                for token in tokens(text) {
                    lengths[i] += 1;
                    counts.entry(token).or_default()[i] += 1;
                }
                totals[i] += u64::from(lengths[i]);
            }
            // At most u32::MAX tools: a catalogue is bounded far below that by its bytes.
            let id = u32::try_from(docs.len()).unwrap_or(u32::MAX);
            for (token, counts) in counts {
                postings.entry(token).or_default().push((id, counts));
            }
            names
                .entry(tool.name.as_str().to_ascii_lowercase())
                .or_default()
                .push(id);
            docs.push(Doc {
                target: ToolRef::new(server.clone(), tool.name.clone()),
                lengths,
            });
        }
        Self {
            docs,
            postings,
            totals,
            names,
        }
    }

    /// The docs `query` names exactly (ignoring ASCII case and surrounding spaces): a tool
    /// name, `server/tool` or `server__tool`.
    fn named(&self, query: &str, out: &mut Vec<u32>) {
        let query = query.trim().to_ascii_lowercase();
        if query.is_empty() {
            return;
        }
        let mut push = |tool: &str, server: Option<&str>| {
            for &doc in self.names.get(tool).into_iter().flatten() {
                let target = &self.docs[doc as usize].target;
                if server.is_none_or(|s| target.server.as_str().eq_ignore_ascii_case(s))
                    && !out.contains(&doc)
                {
                    out.push(doc);
                }
            }
        };
        push(&query, None);
        for separator in ["/", "__"] {
            for (at, _) in query.match_indices(separator) {
                push(&query[at + separator.len()..], Some(&query[..at]));
            }
        }
    }
}

impl std::fmt::Debug for Part {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Part")
            .field("tools", &self.docs.len())
            .finish()
    }
}

/// A keyword index over the tools of one or several servers.
///
/// The guard searches one over a server's permitted tools to answer its search tool; a
/// command line can build one over several servers to search them together.
///
/// Built once, searched many times: a search costs what the query's words' postings hold
/// (the tools sharing a word with it), not the whole index. A Surface keeps the indexes its
/// searches need per server and catalogue version ([`Surface::prepare_search`](crate::Surface::prepare_search)).
#[derive(Clone)]
pub struct SearchIndex {
    parts: Vec<Arc<Part>>,
    docs: usize,
    average_lengths: [f64; FIELDS],
}

impl std::fmt::Debug for SearchIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SearchIndex")
            .field("tools", &self.docs)
            .finish()
    }
}

impl SearchIndex {
    /// Indexes the given tools. Give each pair once; the index searches what it is given, so
    /// narrowing by the grant comes first.
    pub fn new<'a>(tools: impl IntoIterator<Item = (&'a ServerId, &'a ToolDefinition)>) -> Self {
        Self::combine(vec![Arc::new(Part::new(tools))])
    }

    /// One index over several parts, searched as if their tools had been indexed together
    /// (each pair in one part only). Costs a few operations a part.
    pub(crate) fn combine(parts: Vec<Arc<Part>>) -> Self {
        let docs: usize = parts.iter().map(|p| p.docs.len()).sum();
        let mut totals = [0u64; FIELDS];
        for part in &parts {
            for (total, add) in totals.iter_mut().zip(part.totals) {
                *total += add;
            }
        }
        let n = docs.max(1) as f64;
        let average_lengths = totals.map(|total| (total as f64 / n).max(1.0));
        Self {
            parts,
            docs,
            average_lengths,
        }
    }

    /// How many tools are indexed.
    pub fn len(&self) -> usize {
        self.docs
    }

    /// Whether no tool is indexed.
    pub fn is_empty(&self) -> bool {
        self.docs == 0
    }

    /// The best `limit` tools for `query`, best first. Only tools that match at least one
    /// query word are returned; equal scores are ordered by `(server, tool)`.
    pub fn search(&self, query: &str, limit: usize) -> Vec<ToolRef> {
        self.search_scored(query, limit)
            .into_iter()
            .map(|(target, _)| target)
            .collect()
    }

    /// [`SearchIndex::search`] with each hit's BM25F score (higher is better; comparable
    /// only within one query), for callers that show the ranking, such as `psych search`.
    pub fn search_scored(&self, query: &str, limit: usize) -> Vec<(ToolRef, f64)> {
        let terms: BTreeSet<String> = tokens(query).into_iter().collect();
        let n = self.docs as f64;
        let idf: Vec<(&str, f64)> = terms
            .iter()
            .filter_map(|term| {
                let df: usize = self
                    .parts
                    .iter()
                    .filter_map(|part| part.postings.get(term))
                    .map(Vec::len)
                    .sum();
                let df = df as f64;
                (df > 0.0).then(|| (term.as_str(), (1.0 + (n - df + 0.5) / (df + 0.5)).ln()))
            })
            .collect();
        let mut named = Vec::new();
        for (p, part) in self.parts.iter().enumerate() {
            let mut docs = Vec::new();
            part.named(query, &mut docs);
            named.extend(docs.into_iter().map(|doc| (p, doc)));
        }
        if idf.is_empty() && named.is_empty() {
            return Vec::new();
        }
        // Each tool's score adds its terms' shares in term order, as a scan of every tool
        // would: the same floating-point sums, so the same ranking.
        let mut scores: HashMap<(usize, u32), f64> = HashMap::new();
        for (term, idf) in &idf {
            for (p, part) in self.parts.iter().enumerate() {
                let Some(postings) = part.postings.get(*term) else {
                    continue;
                };
                for (doc, counts) in postings {
                    let lengths = &part.docs[*doc as usize].lengths;
                    let mut tf = 0.0;
                    for (field, weight) in WEIGHTS.iter().enumerate() {
                        if counts[field] > 0 {
                            let norm = 1.0 - B
                                + B * f64::from(lengths[field]) / self.average_lengths[field];
                            tf += weight * f64::from(counts[field]) / norm;
                        }
                    }
                    if tf > 0.0 {
                        *scores.entry((p, *doc)).or_insert(0.0) += idf * tf / (K1 + tf);
                    }
                }
            }
        }
        // The tools the query names exactly rank first, scored one above the best score, so
        // equal among themselves and ordered by `(server, tool)`.
        if !named.is_empty() {
            let best = scores.values().copied().fold(0.0, f64::max);
            for key in named {
                scores.insert(key, best + 1.0);
            }
        }
        let mut scored: Vec<(f64, &ToolRef)> = scores
            .into_iter()
            .filter(|(_, score)| *score > 0.0)
            .map(|((p, doc), score)| (score, &self.parts[p].docs[doc as usize].target))
            .collect();
        scored.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(b.1)));
        scored
            .into_iter()
            .take(limit)
            .map(|(score, target)| (target.clone(), score))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use psych_types::ToolName;

    #[test]
    fn identifiers_split_and_stem() {
        assert_eq!(
            tokens("list_pull_requests getFileContents API-get-user"),
            [
                "list", "pull", "request", "get", "file", "content", "api", "get", "user"
            ]
        );
        assert_eq!(
            tokens("the starred repositories with branches"),
            ["star", "repository", "branch"]
        );
    }

    #[test]
    fn names_outrank_descriptions_and_ties_are_ordered() {
        let server = ServerId::new("s").unwrap();
        let object = |s: &str| serde_json::from_str(s).unwrap();
        let tools = [
            ToolDefinition::new(
                ToolName::new("b_other").unwrap(),
                "Mentions branch once",
                object("{}"),
            ),
            ToolDefinition::new(
                ToolName::new("list_branches").unwrap(),
                "List",
                object("{}"),
            ),
            ToolDefinition::new(
                ToolName::new("a_other").unwrap(),
                "Mentions branch once",
                object("{}"),
            ),
        ];
        let index = SearchIndex::new(tools.iter().map(|t| (&server, t)));
        let hits = index.search("which branches exist", 3);
        let names: Vec<_> = hits.iter().map(|h| h.tool.as_str()).collect();
        assert_eq!(names, ["list_branches", "a_other", "b_other"]);
        assert!(index.search("the of", 3).is_empty());
        let scored = index.search_scored("which branches exist", 3);
        let order: Vec<_> = scored.iter().map(|(h, _)| h.clone()).collect();
        assert_eq!(order, hits);
        assert!(scored[0].1 > scored[1].1, "{scored:?}");
        assert_eq!(scored[1].1, scored[2].1, "equal scores tie on the name");
    }

    #[test]
    fn exact_names_rank_first_in_every_form() {
        let object = |s: &str| serde_json::from_str(s).unwrap();
        let (a, b) = (ServerId::new("a").unwrap(), ServerId::new("b").unwrap());
        let tool = |name: &str, description: &str| {
            ToolDefinition::new(ToolName::new(name).unwrap(), description, object("{}"))
        };
        let tools = [
            (&b, tool("get", "get get get the thing")),
            (&a, tool("get", "get")),
            (&a, tool("get_thing", "get the thing, get it, get it now")),
        ];
        let index = SearchIndex::new(tools.iter().map(|(s, t)| (*s, t)));
        let first = |query: &str| index.search(query, 3)[0].to_string();
        assert_eq!(first("get"), "a/get", "shared names rank by server");
        assert_eq!(index.search("get", 3)[1].to_string(), "b/get");
        assert_eq!(first("b/get"), "b/get");
        assert_eq!(first(" B__GET "), "b/get");
        assert_eq!(first("get_thing"), "a/get_thing");
    }

    #[test]
    fn parts_searched_together_rank_as_one_index() {
        let object = |s: &str| serde_json::from_str(s).unwrap();
        let servers: Vec<ServerId> = ["a", "b", "c"]
            .iter()
            .map(|s| ServerId::new(*s).unwrap())
            .collect();
        let words = [
            "list", "branch", "create", "issue", "file", "read", "pull", "request",
        ];
        let tools: Vec<(usize, ToolDefinition)> = (0..60)
            .map(|i| {
                let name = format!("{}_{}_{i}", words[i % 8], words[(i * 3 + 1) % 8]);
                let description = format!("{} the {} {}", words[(i * 5) % 8], words[i % 3], i);
                let tool = ToolDefinition::new(
                    ToolName::new(name).unwrap(),
                    description,
                    object(r#"{"type":"object","properties":{"path":{}}}"#),
                );
                (i % 3, tool)
            })
            .collect();
        let whole = SearchIndex::new(tools.iter().map(|(s, t)| (&servers[*s], t)));
        let parts = (0..3)
            .map(|s| {
                Arc::new(Part::new(
                    tools
                        .iter()
                        .filter(|(t, _)| *t == s)
                        .map(|(t, tool)| (&servers[*t], tool)),
                ))
            })
            .collect();
        let combined = SearchIndex::combine(parts);
        assert_eq!(whole.len(), combined.len());
        for query in [
            "list branches",
            "create a pull request",
            "read file path",
            "nothing",
        ] {
            assert_eq!(
                whole.search_scored(query, 100),
                combined.search_scored(query, 100),
                "{query}"
            );
        }
    }
}
