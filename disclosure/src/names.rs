//! Provider-safe exposed names and what each one means.
//!
//! The scheme, decided once and documented in the crate root:
//!
//! - A direct tool is `server__tool`; a facade is `server`; a search pair is
//!   `server__search_tools` and `server__call_tool`; the meta tools and the orientation
//!   tool have fixed `psych_…` names that are reserved whether or not they are present, and
//!   so are the reader's `read_tool_output` and native deferral's search tools'
//!   (`tool_search`, Anthropic's `tool_search_tool_regex` and `tool_search_tool_bm25`).
//! - A name that is not provider-safe as is (a dotted MCP name, or longer than 64 bytes)
//!   is sanitised (every character outside `[A-Za-z0-9_-]` becomes `_`), cut to 55 bytes
//!   and given the suffix `_` + 8 hex digits of an FNV-1a hash of what it means. Such a
//!   name depends on its own pair only.
//! - A name that is safe as is but collides with another exposed name or a reserved name,
//!   compared ignoring ASCII case (`a__b` + `c` and `a` + `b__c` both make `a__b__c`),
//!   gets the same hashed form, all colliding entries alike; if a hashed form is itself
//!   taken, the hash is salted until it is free. Entries are named in sorted order, so the
//!   result does not depend on input order.
//!
//! Names are reversed through the table only, never by parsing.

use std::collections::{BTreeMap, HashMap, HashSet};

use psych_types::{ANTHROPIC_TOOL_SEARCHES, READ_TOOL_OUTPUT, ServerId, TOOL_SEARCH, ToolRef};
use serde::Serialize;

/// The longest provider tool name (`^[a-zA-Z0-9_-]{1,64}$`).
pub(crate) const MAX_NAME_LEN: usize = 64;

/// The meta tool that lists a server's permitted tools.
pub const LIST_TOOLS: &str = "psych_list_tools";
/// The meta tool that reads one tool's description and schemas.
pub const DESCRIBE_TOOL: &str = "psych_describe_tool";
/// The meta tool that calls one tool by `(server, tool)` pair.
pub const CALL_TOOL: &str = "psych_call_tool";
/// The orientation tool ("call this first").
pub const ORIENTATION: &str = "psych_orientation";

/// Names no exposed entry may take: the fixed ones, the reader's [`READ_TOOL_OUTPUT`],
/// which the runtime and the gateway list and answer beside a Surface's tools, and the
/// search tools native deferral adds to a request ([`TOOL_SEARCH`],
/// [`ANTHROPIC_TOOL_SEARCHES`]): a server of such an id shown as a facade gets another
/// name rather than a second tool of that name, which a provider refuses.
const RESERVED: [&str; 8] = [
    LIST_TOOLS,
    DESCRIBE_TOOL,
    CALL_TOOL,
    ORIENTATION,
    READ_TOOL_OUTPUT,
    TOOL_SEARCH,
    ANTHROPIC_TOOL_SEARCHES[0],
    ANTHROPIC_TOOL_SEARCHES[1],
];

/// One of the three meta tools present whenever a server is deferred.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MetaTool {
    /// [`LIST_TOOLS`]: a page of one server's permitted names with one-line summaries.
    ListTools,
    /// [`DESCRIBE_TOOL`]: one tool's description and schemas.
    DescribeTool,
    /// [`CALL_TOOL`]: call one tool by `(server, tool)`.
    CallTool,
}

impl MetaTool {
    /// The meta tool's fixed name.
    pub fn name(self) -> &'static str {
        match self {
            MetaTool::ListTools => LIST_TOOLS,
            MetaTool::DescribeTool => DESCRIBE_TOOL,
            MetaTool::CallTool => CALL_TOOL,
        }
    }
}

/// What an exposed tool name means: the Surface's resolver answers with one of these.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Exposed {
    /// One remote tool exposed as itself.
    Direct {
        /// The `(server, tool)` pair it calls.
        target: ToolRef,
    },
    /// A server's facade: `{tool, input}` over its permitted tools.
    Facade {
        /// The server.
        server: ServerId,
    },
    /// The search half of a server's search pair.
    Search {
        /// The server.
        server: ServerId,
    },
    /// The call half of a server's search pair: `{tool, input}` like a facade.
    SearchCall {
        /// The server.
        server: ServerId,
    },
    /// A meta tool.
    Meta {
        /// Which one.
        tool: MetaTool,
    },
    /// The orientation tool.
    Orientation,
    /// A deferred server's permitted tool under its qualified name (`server__tool`, named
    /// like a direct tool). It is not among the Surface's tools, which reach its server
    /// through the meta tools; a provider that defers natively is sent its definition with
    /// `defer_loading` under this name ([`Surface::deferred_tools`](crate::Surface::deferred_tools)),
    /// and a call of it, once a search has loaded it, is guarded exactly like a direct call.
    Deferred {
        /// The `(server, tool)` pair it calls.
        target: ToolRef,
    },
}

impl Exposed {
    /// The name this entry asks for before sanitising and collisions.
    fn natural(&self) -> String {
        match self {
            Exposed::Direct { target } | Exposed::Deferred { target } => {
                format!("{}__{}", target.server, target.tool)
            }
            Exposed::Facade { server } => server.to_string(),
            Exposed::Search { server } => format!("{server}__search_tools"),
            Exposed::SearchCall { server } => format!("{server}__call_tool"),
            Exposed::Meta { tool } => tool.name().to_owned(),
            Exposed::Orientation => ORIENTATION.to_owned(),
        }
    }

    /// The bytes the hash suffix is computed from: the kind and the pair, separated by
    /// bytes no id may contain.
    fn hash_key(&self) -> String {
        match self {
            // A pair is never both direct and deferred on one Surface, so a tool keeps its
            // name when its server moves between the two.
            Exposed::Direct { target } | Exposed::Deferred { target } => {
                format!("direct\0{}\0{}", target.server, target.tool)
            }
            Exposed::Facade { server } => format!("facade\0{server}"),
            Exposed::Search { server } => format!("search\0{server}"),
            Exposed::SearchCall { server } => format!("search_call\0{server}"),
            Exposed::Meta { tool } => format!("meta\0{}", tool.name()),
            Exposed::Orientation => "orientation".to_owned(),
        }
    }

    /// The reserved name of a fixed entry (a meta tool, the orientation tool).
    pub(crate) fn fixed_name(&self) -> Option<&'static str> {
        match self {
            Exposed::Meta { tool } => Some(tool.name()),
            Exposed::Orientation => Some(ORIENTATION),
            _ => None,
        }
    }

    /// Whether this entry has a reserved, fixed name.
    fn is_fixed(&self) -> bool {
        matches!(self, Exposed::Meta { .. } | Exposed::Orientation)
    }
}

/// Whether `name` is a provider-safe tool name.
pub(crate) fn is_provider_safe(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// 64-bit FNV-1a: small, stable across machines and releases, enough to tell names apart.
fn fnv1a(bytes: &[u8], salt: u32) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes.iter().chain(salt.to_le_bytes().iter()) {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// The hashed form of an entry's name.
fn hashed(entry: &Exposed, salt: u32) -> String {
    let mut prefix: String = entry
        .natural()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    // ASCII only after sanitising, so any byte index is a char boundary.
    prefix.truncate(MAX_NAME_LEN - 9);
    let hash = fnv1a(entry.hash_key().as_bytes(), salt) & 0xffff_ffff;
    format!("{prefix}_{hash:08x}")
}

/// Names every entry: fixed names for the fixed entries, the scheme above for the rest.
/// Duplicated entries are named once.
pub(crate) fn assign(entries: impl IntoIterator<Item = Exposed>) -> BTreeMap<String, Exposed> {
    let mut entries: Vec<Exposed> = entries.into_iter().collect();
    entries.sort();
    entries.dedup();

    // Names compare ignoring ASCII case: each natural name is folded once (this runs for
    // every deferred tool on every resolve). The reserved names are lowercase already.
    let naturals: Vec<String> = entries.iter().map(Exposed::natural).collect();
    let folded: Vec<String> = naturals.iter().map(|n| n.to_ascii_lowercase()).collect();
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for name in RESERVED {
        *seen.entry(name).or_default() += 1;
    }
    for ((entry, natural), lower) in entries.iter().zip(&naturals).zip(&folded) {
        if !entry.is_fixed() && is_provider_safe(natural) {
            *seen.entry(lower).or_default() += 1;
        }
    }

    let mut table = BTreeMap::new();
    // The names taken, folded: the reserved ones and the natural names kept, then the
    // hashed ones as they are given.
    let mut kept: HashSet<&str> = RESERVED.into_iter().collect();
    let mut pending = Vec::new();
    for ((entry, natural), lower) in entries.into_iter().zip(naturals).zip(&folded) {
        if entry.is_fixed() {
            table.insert(natural, entry);
        } else if is_provider_safe(&natural) && seen.get(lower.as_str()) == Some(&1) {
            kept.insert(lower);
            table.insert(natural, entry);
        } else {
            pending.push(entry);
        }
    }
    let mut hashed_taken: HashSet<String> = HashSet::new();
    for entry in pending {
        let mut salt = 0;
        let name = loop {
            let candidate = hashed(&entry, salt);
            let lower = candidate.to_ascii_lowercase();
            if !kept.contains(lower.as_str()) && hashed_taken.insert(lower) {
                break candidate;
            }
            salt += 1;
        };
        table.insert(name, entry);
    }
    table
}

/// The prefix every name of `server`'s entries begins with, folded: its id sanitised and
/// folded, cut where a hashed name cuts. A natural name kept is `server`, or
/// `server__…`, in an id of safe characters only; a hashed name is the sanitised natural
/// name cut to 55 bytes. So two servers whose zones are not prefixes of one another never
/// compete for a name, and each one's names can be assigned alone ([`claims`]).
pub(crate) fn zone(server: &ServerId) -> String {
    let mut zone: String = server
        .as_str()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect();
    // ASCII only after sanitising, so any byte index is a char boundary.
    zone.truncate(MAX_NAME_LEN - 9);
    zone
}

/// What a table made by [`assign`] over some entries competes for with other entries, as
/// hashes of folded names: the provider-safe natural names of its entries (which decide
/// whether a natural name is kept) and the names it gave (which a hashed name must avoid).
///
/// When the claims of tables assigned separately are pairwise disjoint, the tables'
/// union is what [`assign`] gives over all their entries at once: every natural name is
/// counted once either way, so the same ones are kept, and the salt each hashed name needed
/// alone is the one it needs among all (the names it must avoid are its own table's, since
/// no other table gave a name it claims). A shared hash, true or by chance, only sends the
/// caller to the one pass over all entries, which is always exact.
pub(crate) fn claims(table: &BTreeMap<String, Exposed>) -> HashSet<u64> {
    let mut claims = HashSet::with_capacity(table.len() * 2);
    for (name, entry) in table {
        if entry.is_fixed() {
            continue;
        }
        claims.insert(fnv1a(name.to_ascii_lowercase().as_bytes(), 0));
        let natural = entry.natural();
        if is_provider_safe(&natural) {
            claims.insert(fnv1a(natural.to_ascii_lowercase().as_bytes(), 0));
        }
    }
    claims
}

#[cfg(test)]
mod tests {
    use super::*;

    fn direct(server: &str, tool: &str) -> Exposed {
        Exposed::Direct {
            target: ToolRef::parse(server, tool).unwrap(),
        }
    }

    fn name_of(table: &BTreeMap<String, Exposed>, entry: &Exposed) -> String {
        table
            .iter()
            .find(|(_, e)| *e == entry)
            .map(|(n, _)| n.clone())
            .unwrap()
    }

    #[test]
    fn reserved_names_are_lowercase_as_assign_compares_them() {
        for name in RESERVED {
            assert_eq!(name, name.to_ascii_lowercase());
        }
    }

    #[test]
    fn plain_names_are_server_double_underscore_tool() {
        let table = assign([
            direct("github", "search_code"),
            direct("gitlab", "search_code"),
        ]);
        assert_eq!(
            table.keys().collect::<Vec<_>>(),
            ["github__search_code", "gitlab__search_code"]
        );
    }

    #[test]
    fn dotted_and_long_names_are_sanitised_with_a_hash() {
        let dotted = direct("pw", "browser.navigate");
        let plain = direct("pw", "browser_navigate");
        let long = direct("s", &"x".repeat(128));
        let table = assign([dotted.clone(), plain.clone(), long.clone()]);
        assert_eq!(name_of(&table, &plain), "pw__browser_navigate");
        let dotted_name = name_of(&table, &dotted);
        assert!(
            dotted_name.starts_with("pw__browser_navigate_"),
            "{dotted_name}"
        );
        assert_eq!(dotted_name.len(), "pw__browser_navigate_".len() + 8);
        let long_name = name_of(&table, &long);
        assert_eq!(long_name.len(), MAX_NAME_LEN);
        assert!(table.keys().all(|n| is_provider_safe(n)));
    }

    #[test]
    fn smuggled_separators_collide_and_both_get_hashed() {
        let a = direct("a__b", "c");
        let b = direct("a", "b__c");
        let table = assign([a.clone(), b.clone()]);
        let (na, nb) = (name_of(&table, &a), name_of(&table, &b));
        assert_ne!(na, nb);
        assert!(na.starts_with("a__b__c_") && nb.starts_with("a__b__c_"));
    }

    #[test]
    fn case_variants_are_collisions_and_reserved_names_win() {
        let upper = direct("s", "Get");
        let lower = direct("s", "get");
        let facade = Exposed::Facade {
            server: ServerId::new("psych_list_tools").unwrap(),
        };
        let meta = Exposed::Meta {
            tool: MetaTool::ListTools,
        };
        let reader = Exposed::Facade {
            server: ServerId::new("Read_Tool_Output").unwrap(),
        };
        let table = assign([
            upper.clone(),
            lower.clone(),
            facade.clone(),
            meta.clone(),
            reader.clone(),
        ]);
        assert_eq!(name_of(&table, &meta), LIST_TOOLS);
        assert_ne!(name_of(&table, &facade), LIST_TOOLS);
        assert!(!name_of(&table, &reader).eq_ignore_ascii_case(READ_TOOL_OUTPUT));
        assert_ne!(name_of(&table, &upper), "s__Get");
        assert_ne!(name_of(&table, &lower), "s__get");
        assert_eq!(table.len(), 5);
    }

    #[test]
    fn no_facade_takes_a_native_search_tools_name() {
        let facades: Vec<Exposed> = [
            "tool_search",
            "Tool_Search_Tool_Regex",
            "tool_search_tool_bm25",
        ]
        .into_iter()
        .map(|server| Exposed::Facade {
            server: ServerId::new(server).unwrap(),
        })
        .collect();
        let table = assign(facades.clone());
        for facade in &facades {
            let name = name_of(&table, facade);
            assert!(
                !std::iter::once(TOOL_SEARCH)
                    .chain(ANTHROPIC_TOOL_SEARCHES)
                    .any(|search| name.eq_ignore_ascii_case(search)),
                "{name}"
            );
        }
    }

    #[test]
    fn order_of_entries_does_not_matter() {
        let entries = vec![direct("a__b", "c"), direct("a", "b__c"), direct("z", "q.r")];
        let mut reversed = entries.clone();
        reversed.reverse();
        assert_eq!(assign(entries), assign(reversed));
    }
}
