//! Plain BM25, the baseline Psych's ranking is measured against (`search_quality`,
//! `search_eval`): k1 = 1.2, b = 0.75, one bag of words per tool, lowercased and split at
//! non-alphanumeric characters, no stemming, no stop words, no field weights. Ties by
//! `(server, tool)`.

use std::collections::HashMap;

use psych_types::{ServerId, ToolDefinition, ToolRef};

pub(crate) struct Bm25 {
    docs: Vec<(ToolRef, HashMap<String, u32>, u32)>,
    df: HashMap<String, u32>,
    average: f64,
}

fn plain_words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect()
}

/// A tool's name, title, description and parameter names.
pub(crate) fn full_text(tool: &ToolDefinition) -> String {
    let title = tool
        .title
        .clone()
        .or_else(|| tool.annotations.as_ref().and_then(|a| a.title.clone()))
        .unwrap_or_default();
    let params = tool
        .input_schema
        .get("properties")
        .and_then(|p| p.as_object())
        .map(|p| p.keys().cloned().collect::<Vec<_>>().join(" "))
        .unwrap_or_default();
    format!(
        "{} {title} {} {params}",
        tool.name,
        tool.description_or_empty()
    )
}

/// A tool's name and description only.
pub(crate) fn name_and_description(tool: &ToolDefinition) -> String {
    format!("{} {}", tool.name, tool.description_or_empty())
}

impl Bm25 {
    /// Over [`full_text`].
    pub(crate) fn new(tools: &[(ServerId, ToolDefinition)]) -> Self {
        Self::over(tools, full_text)
    }

    /// Over the text `text` makes of each tool.
    pub(crate) fn over(
        tools: &[(ServerId, ToolDefinition)],
        text: impl Fn(&ToolDefinition) -> String,
    ) -> Self {
        let mut docs = Vec::new();
        let mut df: HashMap<String, u32> = HashMap::new();
        let mut total = 0u64;
        for (server, tool) in tools {
            let words = plain_words(&text(tool));
            let mut tf: HashMap<String, u32> = HashMap::new();
            for word in &words {
                *tf.entry(word.clone()).or_default() += 1;
            }
            for word in tf.keys() {
                *df.entry(word.clone()).or_default() += 1;
            }
            total += words.len() as u64;
            docs.push((
                ToolRef::new(server.clone(), tool.name.clone()),
                tf,
                words.len() as u32,
            ));
        }
        let average = total as f64 / docs.len() as f64;
        Self { docs, df, average }
    }

    /// Every tool sharing a word with `query`, best first.
    pub(crate) fn search(&self, query: &str) -> Vec<ToolRef> {
        let mut terms = plain_words(query);
        terms.sort();
        terms.dedup();
        let n = self.docs.len() as f64;
        let mut scored: Vec<(f64, &ToolRef)> = Vec::new();
        for (target, tf, len) in &self.docs {
            let mut score = 0.0;
            for term in &terms {
                let (Some(&f), Some(&df)) = (tf.get(term), self.df.get(term)) else {
                    continue;
                };
                let idf = (1.0 + (n - f64::from(df) + 0.5) / (f64::from(df) + 0.5)).ln();
                let f = f64::from(f);
                score += idf * f * 2.2 / (f + 1.2 * (0.25 + 0.75 * f64::from(*len) / self.average));
            }
            if score > 0.0 {
                scored.push((score, target));
            }
        }
        scored.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(b.1)));
        scored.into_iter().map(|(_, t)| t.clone()).collect()
    }
}
