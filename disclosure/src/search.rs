//! Keyword search over tools: names, titles, descriptions and parameter names, ranked by
//! BM25F (field-weighted BM25) over stemmed word tokens, with the query's words widened by
//! a reviewed vocabulary of the software and operations domain. Deterministic, offline,
//! no model: the same query over the same tools gives the same ranking in every process.
//!
//! The ranking, decided here and measured in `tests/search_eval.rs` (281 paraphrased
//! queries over 3,101 tools of 17 real catalogues, tuned on its dev split only) and
//! `tests/search_quality.rs`, each against a plain BM25:
//!
//! - Tokens: identifiers are split at `_`, `-`, `.`, spaces and lowerCamel boundaries,
//!   lowercased, and lightly stemmed (plural and `-ing`/`-ed` endings, a final `e`), so
//!   `list_pull_requests` and "pull request" meet. A short list of English function words
//!   is dropped from both sides.
//! - Fields and weights: name 3, title 2, parameter names 1.5, description 1. Each field's
//!   term frequency is normalised by the field's length against its average (b = 0.75),
//!   summed with the weights, and saturated once (k1 = 1.2), so a long description cannot
//!   outweigh a match in the name.
//! - Vocabulary: each query word also looks for its alternatives, and a tool scores the
//!   best of them: the words of its family in `FAMILIES` (create/open/new/add, delete/
//!   remove/drop, run/execute/evaluate, get/show/read/fetch, list/all, update/edit/set,
//!   close → state, approve → review, assign → assignee, ...) and the expansion of an
//!   abbreviation in `ABBREVIATIONS` (PR → pull request, k8s → kubernetes, db, env, ...),
//!   each at 0.6 of the literal word; and the index's words of the same root
//!   (`deployment` for `deploy`) or name words compounding it (`worklog` for `log`) at 0.7.
//!   Two query words of one family make one group, credited once. Alternatives are looked
//!   up in tables built once (the vocabulary per process, roots and compounds per index).
//! - Shapes: a query's piece that is a file name or path (`src/main.rs`, `a.txt`) also
//!   looks for `file`, an address (`https://…`) for `url`, a key like `PROJ-123` for
//!   `issue`, each at 0.6, unless a query word or its alternatives look for it already or
//!   no tool has it. On dev it lifts the two queries naming files from past the 200th to
//!   about the 50th and moves no other.
//! - Name cover: a tool's score is multiplied by `1 + 0.8 × the share of its name's words
//!   the query covers` (literally or by an alternative).
//! - A server the query names (a word of its name or a prefix of five letters or more that
//!   is most of it: "in mongo", "on github"; an abbreviation's expansion: "k8s"; or a word
//!   in two-fifths of its tool names and rare elsewhere: "jira") has its tools' scores
//!   multiplied by up to 1.5. Only the query's own words name a server, not the other words
//!   of their families.
//! - A query that is a tool's exact name, `server/tool` or `server__tool` (ignoring ASCII
//!   case and surrounding spaces) ranks that tool first, whatever the words score: in its
//!   own case above a name that differs only in case. A bare name several servers share
//!   ranks them all first, by server name (`server/tool` picks one); so does a query that
//!   splits two ways (`a__b__c`).
//! - Bounds: a query's first 64 distinct words are searched; one over 256 bytes is not
//!   looked up as a name; a note quotes at most 200 characters of it.
//! - Ties are broken by `(server, tool)`, so the ranking is deterministic.
//! - A weak answer ([`Ranking::is_weak`]): no hit, or a best hit scoring under 0.3 of what
//!   the query could score at best (each word's best alternative matched in full, a word no
//!   tool has counted as missed). Its note names the servers of the best hits.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
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

/// How much a word the query does not say counts beside one it does, when the table below
/// offers it for the query's word: less than the literal word, so precision holds.
const SYNONYM_WEIGHT: f64 = 0.6;
/// How much an indexed word of the same root (`deployment` for `deploy`, `assignee` for
/// `assigned`) counts beside the query's word.
const FORM_WEIGHT: f64 = 0.7;
/// How much more a tool scores when the query names its server (`in mongo`, `on github`,
/// `jira` for a server whose tool names say `jira`): its score times `1 + SERVER_BOOST`.
const SERVER_BOOST: f64 = 0.5;
/// How much more a tool scores when the query's words (or their alternatives) cover its
/// name: its score times `1 + COVER_BOOST × the share of its name's words covered` (by the
/// query's words or their alternatives alike: weighting the alternatives did worse on dev).
const COVER_BOOST: f64 = 0.8;
/// Below this share of what a query could score at best, its best hit is a weak answer.
pub(crate) const WEAK_STRENGTH: f64 = 0.3;
/// How many servers a weak answer names.
const SUGGESTED_SERVERS: usize = 3;
/// The most distinct words of a query that are searched (the first ones): a query comes
/// from a model and may be anything, and each word's alternatives are scanned.
const MAX_QUERY_WORDS: usize = 64;
/// The longest query looked up as a tool's exact name (`server/tool` included): longer than
/// any server id and tool name together.
const MAX_NAMED_QUERY: usize = 256;
/// The most characters of a query a weak answer's note quotes.
const MAX_QUOTED_QUERY: usize = 200;

/// Verb and noun families of the software and operations domain: a query's word of a
/// family also looks for the others (at [`SYNONYM_WEIGHT`]). Reviewed by hand; general
/// vocabulary only, nothing named after a particular catalogue's tools.
const FAMILIES: &[&[&str]] = &[
    &[
        "create", "open", "new", "add", "make", "start", "register", "insert", "send", "post",
    ],
    &[
        "delete",
        "remove",
        "drop",
        "destroy",
        "erase",
        "purge",
        "unregister",
    ],
    &[
        "run", "execute", "evaluate", "invoke", "trigger", "exec", "rerun", "dispatch",
    ],
    &[
        "get", "show", "read", "fetch", "retrieve", "view", "describe", "display", "see", "detail",
        "inspect", "info", "lookup",
    ],
    &["list", "enumerate", "all", "every", "browse"],
    &[
        "update", "edit", "modify", "change", "set", "patch", "rename", "alter", "replace",
    ],
    &["search", "find", "query", "filter", "lookup", "look"],
    &["folder", "directory"],
    &["issue", "ticket", "bug"],
    &["message", "sms", "text"],
    &["label", "tag"],
    &["log", "history"],
    &["stop", "cancel", "halt", "abort", "terminate", "kill"],
    &["resize", "scale"],
    &["approve", "review"],
    &["close", "state", "resolve"],
    &["assign", "assignee"],
    &["user", "account", "me"],
    &["comment", "reply", "note"],
    &["upload", "attach", "attachment"],
    &["navigate", "go", "visit", "goto", "url"],
    &["write", "save", "put"],
    &["download", "export"],
    &["secret", "credential", "token"],
    &["member", "collaborator", "contributor"],
    &["changed", "status", "diff", "modified"],
    &["vm", "instance", "server"],
    &["cluster", "kubernetes"],
    &["function", "lambda", "serverless"],
    &["table", "collection"],
    &["row", "record", "document", "entry"],
];

/// Abbreviations and the words they stand for, one way: the query's abbreviation also looks
/// for its expansion (at [`SYNONYM_WEIGHT`], a phrase's words together).
const ABBREVIATIONS: &[(&str, &str)] = &[
    ("pr", "pull request"),
    ("prs", "pull requests"),
    ("mr", "merge request"),
    ("repo", "repository"),
    ("k8s", "kubernetes"),
    ("kube", "kubernetes"),
    ("db", "database"),
    ("env", "environment"),
    ("config", "configuration"),
    ("cfg", "configuration"),
    ("conf", "configuration"),
    ("msg", "message"),
    ("doc", "document"),
    ("docs", "documentation"),
    ("auth", "authentication"),
    ("authn", "authentication"),
    ("authz", "authorization"),
    ("perm", "permission"),
    ("org", "organization"),
    ("dir", "directory"),
    ("info", "information"),
    ("js", "javascript"),
    ("ts", "typescript"),
    ("ns", "namespace"),
    ("cert", "certificate"),
    ("2fa", "verification"),
    ("sms", "message"),
    ("ci", "continuous integration"),
    ("vm", "virtual machine"),
    ("creds", "credentials"),
    ("stats", "statistics"),
    ("app", "application"),
    ("img", "image"),
    ("pic", "image"),
    ("mongo", "mongodb"),
    ("postgres", "postgresql"),
    ("pg", "postgresql"),
    ("sql", "query"),
    ("wiki", "page"),
];

/// Derivational endings stripped (from a stemmed word) to find a word's root, tried in order,
/// keeping at least four letters: `deployment` → `deploy`, `assigne` → `assign`.
const ROOT_ENDINGS: &[&str] = &[
    "ation", "ition", "ment", "ness", "ion", "ity", "ee", "er", "or", "al", "e",
];

/// The root of a stemmed word, for matching word forms.
fn root(word: &str) -> &str {
    for ending in ROOT_ENDINGS {
        if let Some(base) = word.strip_suffix(ending)
            && base.len() >= 4
        {
            return base;
        }
    }
    word
}

/// An alternative to a query word: the stemmed words that stand for it together, and how
/// much they count.
type Alternative = (Vec<String>, f64);

/// The abbreviations of [`ABBREVIATIONS`], as written there: a query word that is one has
/// its expansion name a server too.
fn abbreviations() -> &'static std::collections::HashSet<&'static str> {
    static SHORT: std::sync::LazyLock<std::collections::HashSet<&'static str>> =
        std::sync::LazyLock::new(|| ABBREVIATIONS.iter().map(|(short, _)| *short).collect());
    &SHORT
}

/// The table's alternatives for each stemmed query word, built once.
fn vocabulary() -> &'static HashMap<String, Vec<Alternative>> {
    static VOCABULARY: std::sync::LazyLock<HashMap<String, Vec<Alternative>>> =
        std::sync::LazyLock::new(|| {
            let mut table: HashMap<String, Vec<Alternative>> = HashMap::new();
            let mut add = |from: &str, to: &str| {
                let (Some(from), to) = (stemmed_word(from), tokens(to)) else {
                    return;
                };
                if to.is_empty() || to == [from.clone()] {
                    return;
                }
                let alternatives = table.entry(from).or_default();
                if !alternatives.iter().any(|(words, _)| *words == to) {
                    alternatives.push((to, SYNONYM_WEIGHT));
                }
            };
            for family in FAMILIES {
                for from in *family {
                    for to in *family {
                        add(from, to);
                    }
                }
            }
            for (from, to) in ABBREVIATIONS {
                add(from, to);
            }
            table
        });
    &VOCABULARY
}

/// How much a word a query's piece says by its shape ([`shape_word`]) counts: as a
/// synonym does.
const SHAPE_WEIGHT: f64 = SYNONYM_WEIGHT;

/// File name extensions common enough that a piece ending in one names a file.
const FILE_EXTENSIONS: &[&str] = &[
    "c", "cc", "cfg", "conf", "cpp", "cs", "css", "csv", "doc", "docx", "gif", "go", "gz", "h",
    "hpp", "html", "ini", "ipynb", "java", "jpeg", "jpg", "js", "json", "jsx", "kt", "log", "md",
    "mjs", "pdf", "php", "png", "py", "rb", "rs", "sh", "sql", "svg", "swift", "tar", "toml", "ts",
    "tsx", "txt", "xls", "xlsx", "xml", "yaml", "yml", "zip",
];

/// Top-level domains that make a word with a dot an address (`example.com`).
const HOST_ENDINGS: &[&str] = &[".com", ".org", ".net", ".io", ".dev"];

/// Standards and identifiers written as capitals, a dash and digits that are not an
/// issue's key (`UTF-8`, `SHA-256`, `RFC-9110`).
const NOT_ISSUE_KEYS: &[&str] = &[
    "AES", "COVID", "CRC", "CVE", "ECMA", "GPT", "HTTP", "IEEE", "IPV", "ISO", "PEP", "RFC", "RSA",
    "SHA", "TLS", "UTF",
];

/// The word a query's piece says by its shape, not its letters: an address (`https://…`,
/// `www.…`, `example.com/x`) says `url`; a file name or path (`src/main.rs:42`, `a.txt`,
/// `.env`, `/etc/hosts`: a known extension, a dot file, or a path of two parts or more
/// from the root, home or here) says `file`; a key of capitals, a dash and digits
/// (`PROJ-123`, not a standard's `UTF-8`) says `issue`. An e-mail address says nothing.
fn shape_word(piece: &str) -> Option<&'static str> {
    /// Punctuation around a piece: `(a.txt).`, `**a.txt**`, `[a.txt]`.
    fn around(c: char) -> bool {
        matches!(
            c,
            ',' | ';'
                | ':'
                | '.'
                | '('
                | ')'
                | '['
                | ']'
                | '{'
                | '}'
                | '<'
                | '>'
                | '"'
                | '\''
                | '`'
                | '*'
                | '?'
                | '!'
        )
    }
    // A leading dot is kept: `.env` is a file.
    let mut piece = piece
        .trim_end_matches(around)
        .trim_start_matches(|c: char| c != '.' && around(c));
    // `src/main.rs:42`, `src/main.rs:10:5`: a file and a place in it.
    for _ in 0..2 {
        if let Some((file, line)) = piece.rsplit_once(':')
            && !line.is_empty()
            && line.bytes().all(|b| b.is_ascii_digit())
        {
            piece = file;
        }
    }
    if piece.is_empty() {
        return None;
    }
    if piece.contains("://") || piece.starts_with("www.") {
        return Some("url");
    }
    // An e-mail address; `@` in a path (`medium.com/@user`, `@types/node`) is not one.
    if piece.contains('@') && !piece.contains('/') {
        return None;
    }
    let host = piece.split('/').next().unwrap_or(piece);
    let hosted = HOST_ENDINGS
        .iter()
        .any(|end| host.len() > end.len() + 1 && host.ends_with(end));
    if hosted {
        return Some("url");
    }
    if let Some((key, number)) = piece.split_once('-')
        && (2..=10).contains(&key.len())
        && key.bytes().all(|b| b.is_ascii_uppercase())
        && !NOT_ISSUE_KEYS.contains(&key)
        && !number.is_empty()
        && number.bytes().all(|b| b.is_ascii_digit())
    {
        return Some("issue");
    }
    let last = piece.rsplit('/').next().unwrap_or(piece);
    let named = match last.rsplit_once('.') {
        // A dot file: `.env`, `.gitignore`.
        Some(("", name)) => name.len() >= 2 && name.bytes().all(|b| b.is_ascii_lowercase()),
        // `Node.js`, `Vue.js` are libraries: a capital before `.js` names one.
        Some((stem, "js")) if stem.starts_with(|c: char| c.is_ascii_uppercase()) => false,
        Some((stem, extension)) => {
            extension.len() <= 5
                && stem.chars().any(|c| c.is_alphabetic() || c == '_')
                && FILE_EXTENSIONS.contains(&extension.to_ascii_lowercase().as_str())
        }
        None => false,
    };
    // A path from the root, home or here, of two parts or more (`/help` is a command).
    let path = ["/", "~/", "./", "../"]
        .iter()
        .any(|start| piece.starts_with(start))
        && piece.split('/').filter(|part| !part.is_empty()).count() >= 2;
    (named || path).then_some("file")
}

/// One word as a query token, or `None` for a stop word.
fn stemmed_word(word: &str) -> Option<String> {
    let mut tokens = tokens(word);
    (tokens.len() == 1).then(|| tokens.remove(0))
}

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
    /// Each indexed word's root ([`root`]) to the indexed words of that root.
    roots: HashMap<String, Vec<String>>,
    /// A root to the name words made of a word of that root and another index word.
    compounds: HashMap<String, Vec<String>>,
    /// How many tools each server has here.
    servers: BTreeMap<ServerId, u32>,
    /// Each server's name as words (`github-rest`: `github`, `rest`), for a query naming it.
    server_words: BTreeMap<ServerId, Vec<String>>,
    /// For each word of a tool name, how many tools of each server have it in their name.
    name_words: HashMap<String, Vec<(ServerId, u32)>>,
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
        let mut servers: BTreeMap<ServerId, u32> = BTreeMap::new();
        let mut name_words: BTreeMap<(String, ServerId), u32> = BTreeMap::new();
        for (server, tool) in tools {
            *servers.entry(server.clone()).or_default() += 1;
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
                if counts[0] > 0 {
                    *name_words
                        .entry((token.clone(), server.clone()))
                        .or_default() += 1;
                }
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
        let mut roots: HashMap<String, Vec<String>> = HashMap::new();
        let mut words: Vec<&String> = postings.keys().collect();
        words.sort();
        for word in words {
            roots
                .entry(root(word).to_owned())
                .or_default()
                .push(word.clone());
        }
        // A name word made of two index words (`worklog`, `taskrouter`): each half's root
        // finds it, as a word form does.
        let mut compounds: HashMap<String, Vec<String>> = HashMap::new();
        let mut named_words: Vec<&String> = name_words.keys().map(|(word, _)| word).collect();
        named_words.dedup();
        for word in named_words {
            if word.len() < 7 || !word.bytes().all(|b| b.is_ascii_lowercase()) {
                continue;
            }
            let known = |half: &str| roots.contains_key(root(half));
            if let Some(at) =
                (3..=word.len() - 3).find(|&at| known(&word[..at]) && known(&word[at..]))
            {
                for half in [&word[..at], &word[at..]] {
                    let list = compounds.entry(root(half).to_owned()).or_default();
                    // Each word comes once (the words are deduplicated), so it can only
                    // be the last one pushed: its other half had the same root. Checked
                    // at the end, not through the list, which a catalogue of many
                    // compounds of one root would make quadratic.
                    if list.last() != Some(word) {
                        list.push(word.clone());
                    }
                }
            }
        }
        let mut by_word: HashMap<String, Vec<(ServerId, u32)>> = HashMap::new();
        for ((word, server), count) in name_words {
            by_word.entry(word).or_default().push((server, count));
        }
        Self {
            docs,
            postings,
            totals,
            names,
            roots,
            compounds,
            server_words: servers
                .keys()
                .map(|server| (server.clone(), tokens(server.as_str())))
                .collect(),
            servers,
            name_words: by_word,
        }
    }

    /// The docs `query` names exactly (ignoring ASCII case and surrounding spaces): a tool
    /// name, `server/tool` or `server__tool`; each with whether the case matched too (a
    /// query that names one tool in its own case ranks it above one whose name differs
    /// only in case).
    fn named(&self, query: &str, out: &mut Vec<(u32, bool)>) {
        let query = query.trim();
        if query.is_empty() || query.len() > MAX_NAMED_QUERY {
            return;
        }
        let lower = query.to_ascii_lowercase();
        let mut push = |at: usize, skip: usize| {
            let (tool, server) = match at {
                0 => (query, None),
                _ => (&query[at + skip..], Some(&query[..at])),
            };
            let key = tool.to_ascii_lowercase();
            for &doc in self.names.get(&key).into_iter().flatten() {
                let target = &self.docs[doc as usize].target;
                if server.is_none_or(|s| target.server.as_str().eq_ignore_ascii_case(s)) {
                    // The tool's name in its own case (a server's name is matched without).
                    let exact = target.tool.as_str() == tool;
                    match out.iter_mut().find(|(known, _)| *known == doc) {
                        Some((_, known)) => *known |= exact,
                        None => out.push((doc, exact)),
                    }
                }
            }
        };
        push(0, 0);
        for separator in ["/", "__"] {
            for (at, _) in lower.match_indices(separator) {
                if at > 0 {
                    push(at, separator.len());
                }
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

    /// [`SearchIndex::search`] with each hit's score (higher is better; comparable only
    /// within one query), for callers that show the ranking, such as `psych search`.
    pub fn search_scored(&self, query: &str, limit: usize) -> Vec<(ToolRef, f64)> {
        self.rank(query, limit).hits
    }

    /// The ranking of [`SearchIndex::search_scored`] with what a reader needs to judge it:
    /// how strong the best hit is against what the query could score, and the servers whose
    /// tools match it best ([`Ranking::note`] says so when the answer is weak).
    pub fn rank(&self, query: &str, limit: usize) -> Ranking {
        // Tokenized a whitespace-separated piece at a time (the same words: whitespace
        // separates words anyway), so a query of any length costs only up to its 64th word.
        let mut literal: BTreeSet<String> = BTreeSet::new();
        // Words the pieces' shapes say without saying them ([`shape_word`]), of the same
        // pieces as the words searched.
        let mut shaped: BTreeSet<&'static str> = BTreeSet::new();
        'pieces: for piece in query.split_whitespace() {
            if literal.len() == MAX_QUERY_WORDS {
                break;
            }
            shaped.extend(shape_word(piece));
            for word in tokens(piece) {
                if literal.len() == MAX_QUERY_WORDS {
                    break 'pieces;
                }
                literal.insert(word);
            }
        }
        let n = self.docs as f64;
        // A word's inverse document frequency over every part; 0 when no tool has it.
        let idf = |term: &str| -> f64 {
            let df: usize = self
                .parts
                .iter()
                .filter_map(|part| part.postings.get(term))
                .map(Vec::len)
                .sum();
            if df == 0 {
                return 0.0;
            }
            let df = df as f64;
            (1.0 + (n - df + 0.5) / (df + 0.5)).ln()
        };
        // The most an unknown word could have scored: a word of one tool.
        let unknown = (1.0 + (n - 0.5) / 1.5).ln();

        // Each query word with its alternatives: the table's, and the index's words of the
        // same root.
        let vocabulary = vocabulary();
        let mut groups: Vec<Vec<Alternative>> = Vec::with_capacity(literal.len());
        // A word's one-word alternatives so far, so that a form is added once without a
        // scan of the list (a root of many forms or compounds would make it quadratic);
        // borrowed from the query, the vocabulary and the index, which outlive it.
        let mut single: HashSet<&str> = HashSet::new();
        for word in &literal {
            // A word of a family already asked for joins that word's group as a literal,
            // so that "start a new" credits `create` once, not twice.
            if let Some(known) = groups.iter_mut().find_map(|group| {
                group
                    .iter_mut()
                    .find(|(words, _)| words.len() == 1 && words[0] == *word)
            }) {
                known.1 = 1.0;
                continue;
            }
            let mut alternatives: Vec<Alternative> = vec![(vec![word.clone()], 1.0)];
            single.clear();
            single.insert(word.as_str());
            if let Some(more) = vocabulary.get(word) {
                alternatives.extend(more.iter().cloned());
                single.extend(
                    more.iter()
                        .filter(|(words, _)| words.len() == 1)
                        .map(|(words, _)| words[0].as_str()),
                );
            }
            for part in &self.parts {
                let forms = part.roots.get(root(word)).into_iter().flatten();
                let compounds = part.compounds.get(root(word)).into_iter().flatten();
                for form in forms.chain(compounds) {
                    if single.insert(form.as_str()) {
                        alternatives.push((vec![form.clone()], FORM_WEIGHT));
                    }
                }
            }
            groups.push(alternatives);
        }
        // A word a piece's shape says is a group of its own, at a synonym's weight (it is
        // not the query's word), unless a group already looks for it, or no tool has it
        // (so that a word the query did not say cannot make its answer weak).
        for word in shaped.into_iter().filter_map(stemmed_word) {
            let asked = groups
                .iter()
                .flatten()
                .any(|(words, _)| words.len() == 1 && words[0] == word);
            if !asked && idf(&word) > 0.0 {
                groups.push(vec![(vec![word], SHAPE_WEIGHT)]);
            }
        }

        let mut best_possible = 0.0;
        // Per tool: its score, and how many of its name's words the query covers.
        let mut scores: HashMap<(usize, u32), (f64, f64)> = HashMap::new();
        let mut group_scores: HashMap<(usize, u32), (f64, f64)> = HashMap::new();
        let mut alternative_scores: HashMap<(usize, u32), (f64, f64)> = HashMap::new();
        for alternatives in &groups {
            group_scores.clear();
            let mut group_best = 0.0f64;
            for (words, weight) in alternatives {
                alternative_scores.clear();
                let mut most = 0.0;
                for word in words {
                    let idf = idf(word);
                    if idf > 0.0 {
                        most += idf;
                        self.add_term(word, idf, &mut alternative_scores);
                    }
                }
                group_best = group_best.max(weight * most);
                for (key, (score, names)) in &alternative_scores {
                    let entry = group_scores.entry(*key).or_insert((0.0, 0.0));
                    entry.0 = entry.0.max(weight * score);
                    entry.1 = entry.1.max(*names);
                }
            }
            best_possible += if group_best > 0.0 {
                group_best
            } else {
                unknown
            };
            // Added in group order for every tool, so the same sums in every process.
            for (key, (score, names)) in &group_scores {
                let entry = scores.entry(*key).or_insert((0.0, 0.0));
                entry.0 += score;
                entry.1 += names;
            }
        }
        let mut scores: HashMap<(usize, u32), f64> = scores
            .into_iter()
            .map(|((p, doc), (score, names))| {
                let length = f64::from(self.parts[p].docs[doc as usize].lengths[0].max(1));
                let covered = names.min(length) / length;
                ((p, doc), score * (1.0 + COVER_BOOST * covered))
            })
            .collect();

        // A server the query names weighs its tools more.
        let named_servers = self.named_servers(&literal, vocabulary);
        if !named_servers.is_empty() {
            for ((p, doc), score) in &mut scores {
                let server = &self.parts[*p].docs[*doc as usize].target.server;
                if let Some(strength) = named_servers.get(server) {
                    *score *= 1.0 + SERVER_BOOST * strength.min(1.0);
                }
            }
        }

        let mut named = Vec::new();
        for (p, part) in self.parts.iter().enumerate() {
            let mut docs = Vec::new();
            part.named(query, &mut docs);
            named.extend(docs.into_iter().map(|(doc, exact)| ((p, doc), exact)));
        }
        let mut strength = 0.0;
        let top = scores.values().copied().fold(0.0, f64::max);
        if best_possible > 0.0 {
            strength = (top / best_possible).min(1.0);
        }
        // The tools the query names exactly rank first, scored above the best score: those
        // named in their own case first, then those whose name differs only in case; equal
        // among themselves, ordered by `(server, tool)`.
        if !named.is_empty() {
            strength = 1.0;
            for (key, exact) in named {
                scores.insert(key, top + if exact { 2.0 } else { 1.0 });
            }
        }
        let mut scored: Vec<(f64, &ToolRef)> = scores
            .into_iter()
            .filter(|(_, score)| *score > 0.0)
            .map(|((p, doc), score)| (score, &self.parts[p].docs[doc as usize].target))
            .collect();
        scored.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(b.1)));
        let mut servers: Vec<&ServerId> = Vec::new();
        for (_, target) in &scored {
            if servers.len() == SUGGESTED_SERVERS {
                break;
            }
            if !servers.contains(&&target.server) {
                servers.push(&target.server);
            }
        }
        let servers = servers.into_iter().cloned().collect();
        Ranking {
            hits: scored
                .into_iter()
                .take(limit)
                .map(|(score, target)| (target.clone(), score))
                .collect(),
            strength,
            servers,
        }
    }

    /// Adds `term`'s BM25F share to each tool holding it, and one to the name words matched
    /// of each tool holding it in its name.
    fn add_term(&self, term: &str, idf: f64, scores: &mut HashMap<(usize, u32), (f64, f64)>) {
        for (p, part) in self.parts.iter().enumerate() {
            let Some(postings) = part.postings.get(term) else {
                continue;
            };
            for (doc, counts) in postings {
                let lengths = &part.docs[*doc as usize].lengths;
                let mut tf = 0.0;
                for (field, weight) in WEIGHTS.iter().enumerate() {
                    if counts[field] > 0 {
                        let norm =
                            1.0 - B + B * f64::from(lengths[field]) / self.average_lengths[field];
                        tf += weight * f64::from(counts[field]) / norm;
                    }
                }
                if tf > 0.0 {
                    let entry = scores.entry((p, *doc)).or_insert((0.0, 0.0));
                    entry.0 += idf * tf / (K1 + tf);
                    if counts[0] > 0 {
                        entry.1 += 1.0;
                    }
                }
            }
        }
    }

    /// The servers the query names, with how surely: a word of the server's name (its
    /// prefix of four letters or more counts: `mongo` for `mongodb`; a word several servers'
    /// names share counts by its share of each name: `github` for `github-rest` half), an abbreviation of one (`k8s`), or a word in at least
    /// two-fifths of the server's tool names that is rare in other servers' names (`jira`).
    fn named_servers(
        &self,
        literal: &BTreeSet<String>,
        vocabulary: &HashMap<String, Vec<Alternative>>,
    ) -> BTreeMap<ServerId, f64> {
        // The query's own words and the expansions of its abbreviations (`k8s`): not the
        // other words of a family, or "delete" would name a server called `dropbox`.
        let mut said: BTreeSet<&str> = literal.iter().map(String::as_str).collect();
        for word in literal {
            if abbreviations().contains(word.as_str()) {
                for (words, _) in vocabulary.get(word).into_iter().flatten() {
                    if words.len() == 1 {
                        said.insert(words[0].as_str());
                    }
                }
            }
        }
        let mut named: BTreeMap<ServerId, f64> = BTreeMap::new();
        for word in &said {
            let mut matched: Vec<(&ServerId, f64)> = Vec::new();
            for part in &self.parts {
                for (server, id) in &part.server_words {
                    // A prefix names it when it is most of the word: `mongo` for `mongodb`,
                    // not `open` for `openai` nor `post` for `postgres`.
                    let says = |name: &String| {
                        name == word
                            || (word.len() >= 5
                                && name.starts_with(*word)
                                && 3 * word.len() >= 2 * name.len())
                    };
                    if id.iter().any(says) {
                        matched.push((server, 1.0 / id.len().max(1) as f64));
                    }
                }
            }
            // A word only one server's name has names it outright.
            let alone = matched.len() == 1;
            for (server, share) in matched {
                *named.entry(server.clone()).or_default() += if alone { 1.0 } else { share };
            }
        }
        for word in &said {
            let mut total = 0;
            for part in &self.parts {
                for (_, count) in part.name_words.get(*word).into_iter().flatten() {
                    total += count;
                }
            }
            for part in &self.parts {
                for (server, count) in part.name_words.get(*word).into_iter().flatten() {
                    let tools = part.servers.get(server).copied().unwrap_or(0);
                    if *count >= 2 && 5 * count >= 2 * tools && 2 * count >= total {
                        *named.entry(server.clone()).or_default() += 1.0;
                    }
                }
            }
        }
        named
    }
}

/// A search's answer with what a reader needs to judge it ([`SearchIndex::rank`]).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Ranking {
    /// The best tools with their scores, best first.
    pub hits: Vec<(ToolRef, f64)>,
    /// The best hit's score as a share of the most the query could score (each query
    /// word's best alternative matched in full; a word no tool has counts as missed), from 0
    /// to 1; 1 for a query that names a tool exactly.
    pub strength: f64,
    /// The servers of the best-scored tools, best first, at most three: where to look when
    /// the answer is weak.
    pub servers: Vec<ServerId>,
}

impl Ranking {
    /// Whether nothing matched, or only weakly: the best hit scores less than 0.3 of what
    /// the query could (a query whose words all match one tool's name scores about 0.7).
    pub fn is_weak(&self) -> bool {
        self.hits.is_empty() || self.strength < WEAK_STRENGTH
    }

    /// What to tell a model about a weak answer, naming the servers to list
    /// (the same words on every surface: "No tool matches …", then the closest servers);
    /// `None` when the answer is not weak.
    pub fn note(&self, query: &str) -> Option<String> {
        self.is_weak()
            .then(|| weak_note(query, self.hits.is_empty(), &self.servers))
    }
}

/// The note of a weak answer: that nothing matched (`no_hits`) or only weakly, and the
/// servers closest to the query, to list. The same words on every surface.
pub(crate) fn weak_note(query: &str, no_hits: bool, servers: &[ServerId]) -> String {
    let query = match query.char_indices().nth(MAX_QUOTED_QUERY) {
        Some((at, _)) => format!("{}…", &query[..at]),
        None => query.to_owned(),
    };
    let mut note = if no_hits {
        format!("No tool matches {query:?}.")
    } else {
        format!("No tool matches {query:?} well; these are weak matches.")
    };
    if servers.is_empty() {
        note.push_str(" Try other words.");
    } else {
        let servers: Vec<&str> = servers.iter().map(ServerId::as_str).collect();
        note.push_str(&format!(
            " The servers closest to it: {}. Try other words, or look among their tools.",
            servers.join(", ")
        ));
    }
    note
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
    fn weak_answers_say_so_and_name_the_closest_servers() {
        let object = |s: &str| serde_json::from_str(s).unwrap();
        let (a, b) = (
            ServerId::new("git").unwrap(),
            ServerId::new("mail").unwrap(),
        );
        let tool = |name: &str, description: &str| {
            ToolDefinition::new(ToolName::new(name).unwrap(), description, object("{}"))
        };
        let tools = [
            (&a, tool("git_commit", "Record changes to the repository")),
            (&a, tool("git_log", "Show the commit history")),
            (&b, tool("send_mail", "Send an email to a recipient")),
        ];
        let index = SearchIndex::new(tools.iter().map(|(s, t)| (*s, t)));
        let strong = index.rank("commit my changes to the repository", 5);
        assert!(!strong.is_weak(), "{strong:?}");
        assert_eq!(strong.note("commit my changes to the repository"), None);
        let none = index.rank("bake a chocolate cake", 5);
        assert_eq!(
            none.note("bake a chocolate cake").unwrap(),
            "No tool matches \"bake a chocolate cake\". Try other words."
        );
        let query = "bake a cake and send it to grandma";
        let weak = index.rank(query, 5);
        assert!(weak.is_weak(), "{weak:?}");
        assert_eq!(weak.hits[0].0.to_string(), "mail/send_mail");
        assert_eq!(
            weak.note(query).unwrap(),
            "No tool matches \"bake a cake and send it to grandma\" well; these are weak \
             matches. The servers closest to it: mail. Try other words, or look among their tools."
        );
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

    fn tools_of(specs: &[(&str, &str, &str)]) -> Vec<(ServerId, ToolDefinition)> {
        specs
            .iter()
            .map(|(server, name, description)| {
                (
                    ServerId::new(*server).unwrap(),
                    ToolDefinition::new(
                        ToolName::new(*name).unwrap(),
                        *description,
                        serde_json::from_str("{}").unwrap(),
                    ),
                )
            })
            .collect()
    }

    /// Review of issue 32: names that differ only in case, and a query that splits two
    /// ways, rank deterministically, the query's own case first.
    #[test]
    fn a_name_in_its_own_case_outranks_one_that_differs_only_in_case() {
        let tools = tools_of(&[
            ("api", "getUser", "Gets a user."),
            ("api", "getuser", "Gets a user, lower case."),
            ("a", "b__c", "One split."),
            ("a__b", "c", "The other split."),
        ]);
        let index = SearchIndex::new(tools.iter().map(|(s, t)| (s, t)));
        for query in ["getuser", "api/getuser", "API__getuser"] {
            assert_eq!(
                index.search(query, 1)[0].tool.as_str(),
                "getuser",
                "{query}"
            );
        }
        for query in ["getUser", "api/getUser", "api__getUser"] {
            assert_eq!(
                index.search(query, 1)[0].tool.as_str(),
                "getUser",
                "{query}"
            );
        }
        // Both splits are named: first by (server, tool), the same in every process.
        let split = index.search("a__b__c", 2);
        assert_eq!(split.len(), 2);
        assert_eq!(
            (split[0].server.as_str(), split[0].tool.as_str()),
            ("a", "b__c")
        );
    }

    /// Review of issue 32: a model's query of any size costs about its size; the first 64
    /// distinct words are searched, and a note quotes at most 200 characters of it.
    #[test]
    fn a_huge_query_is_bounded() {
        let tools = tools_of(&[("s", "list_branches", "List the branches.")]);
        let index = SearchIndex::new(tools.iter().map(|(s, t)| (s, t)));
        let slashes = "/".repeat(4 * 1024 * 1024);
        let started = std::time::Instant::now();
        assert!(index.search(&slashes, 5).is_empty());
        let words: String = (0..100_000).map(|i| format!("word{i} ")).collect();
        let ranking = index.rank(&format!("{words} branches"), 5);
        assert!(ranking.hits.is_empty(), "the 64 first words only");
        assert!(started.elapsed() < std::time::Duration::from_secs(20));
        let note = ranking.note(&words).unwrap();
        assert!(note.len() < 400, "{} bytes", note.len());
    }

    /// A file name or path says `file`, an address `url`, an issue key `issue`; other
    /// pieces with dots, dashes or slashes say nothing.
    #[test]
    fn a_piece_says_a_word_by_its_shape() {
        for (piece, word) in [
            ("src/main.rs", Some("file")),
            ("src/main.rs:42", Some("file")),
            ("a.txt,", Some("file")),
            ("[a.txt]", Some("file")),
            ("**README.MD**", Some("file")),
            (".env", Some("file")),
            (".gitignore", Some("file")),
            ("/etc/hosts", Some("file")),
            ("~/notes", Some("file")),
            ("`.circleci/config.yml`", Some("file")),
            ("https://example.com", Some("url")),
            ("www.example.com.", Some("url")),
            ("example.com", Some("url")),
            ("github.com/owner/repo", Some("url")),
            ("example.dev", Some("url")),
            ("PROJ-123", Some("issue")),
            ("proj-123", None),
            ("UTF-8", None),
            ("SHA-256", None),
            ("v1.2", None),
            ("v1.2.x", None),
            ("3.14", None),
            ("1.5GB", None),
            ("2.5s", None),
            ("1.txt", None),
            ("and/or", None),
            ("TCP/IP", None),
            ("/", None),
            ("/help", None),
            ("end.", None),
            ("e.g.", None),
            ("Ph.D.", None),
            ("JSON.parse", None),
            ("os.path", None),
            ("ASP.NET", None),
            (".NET", None),
            ("bob@example.com", None),
            ("https://medium.com/@user/post", Some("url")),
            ("node_modules/@types/node/index.d.ts", Some("file")),
            ("src/main.rs:10:5", Some("file")),
            ("(a.txt).", Some("file")),
            ("файл.pdf", Some("file")),
            ("Node.js", None),
            ("Vue.js", None),
            ("app.js", Some("file")),
            ("localhost:8080", None),
            ("", None),
        ] {
            assert_eq!(shape_word(piece), word, "{piece}");
        }
        // Two tools of one name whose descriptions differ only in what they take: without
        // the shape's word they tie, and the tie goes to server `a`.
        let tools = |url: &str, file: &str| {
            tools_of(&[
                (url, "fetch", "Fetches a URL."),
                (file, "fetch", "Fetches a file."),
            ])
        };
        let ranked = |tools: &[(ServerId, ToolDefinition)], query: &str| {
            let index = SearchIndex::new(tools.iter().map(|(s, t)| (s, t)));
            index.search(query, 1)[0].server.as_str().to_owned()
        };
        assert_eq!(ranked(&tools("a", "b"), "fetch src/main.rs"), "b");
        assert_eq!(ranked(&tools("b", "a"), "fetch https://example.com/x"), "b");
        // A shape's word no tool has is not looked for: it cannot make an answer weak.
        let index = SearchIndex::new(tools("a", "b").iter().map(|(s, t)| (s, t)));
        let unshaped = index.rank("fetch proj-123", 5).strength;
        assert!(unshaped > 0.0);
        assert_eq!(index.rank("fetch PROJ-123", 5).strength, unshaped);
    }

    /// Review of issue 32: a server is named by the query's own words, not by the other
    /// words of their families ("delete" does not name `dropbox` through "drop"), and a
    /// short prefix does not name a longer server name (`open` is not `openai`).
    #[test]
    fn only_the_querys_own_words_name_a_server() {
        let tools = tools_of(&[
            ("dropbox", "remove_file", "Removes a file."),
            ("openai", "create_thing", "Creates a thing."),
            ("mongodb", "find", "Finds documents."),
        ]);
        let index = SearchIndex::new(tools.iter().map(|(s, t)| (s, t)));
        let literal = |query: &str| tokens(query).into_iter().collect::<BTreeSet<_>>();
        let named = |query: &str| index.named_servers(&literal(query), vocabulary());
        assert!(named("delete a file").is_empty());
        assert!(named("open a new thing").is_empty());
        assert!(named("find in mongo").contains_key(&ServerId::new("mongodb").unwrap()));
    }
}
