//! Who is asking over HTTP: bearer tokens, each naming an identity.
//!
//! The tokens file is JSON, each identity with the SHA-256 digests of its tokens (the
//! tokens themselves are never stored):
//!
//! ```json
//! {"identities": {
//!   "alice": {"tokens": ["sha256:9f86d081884c7d65..."]},
//!   "ci": {"tokens": ["sha256:..."], "allowTools": {"github": ["get_issue"], "fs": "*"}}
//! }}
//! ```
//!
//! An identity with `allowTools` is granted only the servers it names, each to the tools
//! it lists that the MCP config grants too (`"*"`: all of them); its listing is its own.
//! One without is granted what the config grants.
//!
//! [`new_token`] makes a token and its digest (`psych serve-token NAME`). A token is 256
//! random bits, so its digest needs no salt and a lookup by digest leaks nothing useful
//! through timing: what a timing difference could reveal is a prefix of a digest, not of a
//! token.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use sha2::{Digest, Sha256};

/// The prefix of a stored digest.
const SHA256: &str = "sha256:";

/// Identities that name the gateway's own callers and may not be given tokens: `stdio`
/// (the stdio client) and `loopback` (HTTP without tokens).
pub const RESERVED_IDENTITIES: [&str; 2] = ["stdio", "loopback"];

/// The identities a bearer token may present, loaded from a tokens file.
#[derive(Debug, Clone, Default)]
pub struct Tokens {
    by_digest: HashMap<[u8; 32], String>,
    narrowings: BTreeMap<String, Narrowing>,
}

/// What an identity's `allowTools` allows: per server, its tools (`None`: all the MCP
/// config grants).
pub(crate) type Narrowing = BTreeMap<String, Option<Vec<String>>>;

/// Why a tokens file was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokensError {
    /// The file could not be read.
    #[error("reading the tokens file {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not the tokens JSON.
    #[error(
        "the tokens file is not {{\"identities\": {{NAME: {{\"tokens\": [\"sha256:HEX\", ...]}}}}}}"
    )]
    Shape(#[source] serde_json::Error),
    /// An identity's name is not `[A-Za-z0-9_-]{1,64}`, or is reserved (in any case).
    #[error(
        "the tokens file: identity {0:?} is not a name of 1 to 64 letters, digits, '_' or '-', \
         or is one of psych's own (stdio, loopback)"
    )]
    Name(String),
    /// A token digest is not `sha256:` and 64 hexadecimal digits.
    #[error(
        "the tokens file: identity {identity:?} has a token that is not sha256:<64 hex digits>"
    )]
    Digest {
        /// Whose.
        identity: String,
    },
    /// An `allowTools` names a server or a tool by a name no server or tool can have.
    #[error(
        "the tokens file: identity {identity:?} allows {name:?}, which is no server or tool name"
    )]
    AllowTools {
        /// Whose.
        identity: String,
        /// The name.
        name: String,
    },
    /// Two identities share a token.
    #[error("the tokens file: identities {0:?} and {1:?} share a token")]
    Shared(String, String),
    /// Two identities' names differ only in case: their logs' folders (`<dir>/serve/NAME`)
    /// would be one on a case-insensitive file system (macOS's, Windows'), each reading
    /// the other's results.
    #[error(
        "the tokens file: identities {0:?} and {1:?} differ only in case; their logs would \
         share a folder where file names ignore case"
    )]
    SameFolder(String, String),
    /// An identity is named twice: JSON readers keep one of the two entries (serde the
    /// last), so the other's tokens or narrowing would be dropped without a word.
    #[error("the tokens file names identity {0:?} twice")]
    IdentityTwice(String),
    /// An identity's `allowTools` names a server twice: one of the two would be dropped
    /// without a word (a list of tools, widened to `"*"` say).
    #[error("the tokens file: identity {identity:?} names server {server:?} twice in allowTools")]
    ServerTwice {
        /// Whose.
        identity: String,
        /// The server named twice.
        server: String,
    },
    /// No identity has a token: nobody could connect.
    #[error("the tokens file names no token")]
    Empty,
    /// The system's random source failed.
    #[error("the system's random source")]
    Random(#[source] getrandom::Error),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    identities: Pairs<Entry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    tokens: Vec<String>,
    #[serde(rename = "allowTools")]
    allow_tools: Option<Pairs<Allowed>>,
}

/// A JSON object's members in the file's order, a key given twice kept twice (a map would
/// keep one of them), so that `parse` can refuse it.
struct Pairs<V>(Vec<(String, V)>);

impl<'de, V: Deserialize<'de>> Deserialize<'de> for Pairs<V> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Members<V>(std::marker::PhantomData<V>);
        impl<'de, V: Deserialize<'de>> serde::de::Visitor<'de> for Members<V> {
            type Value = Pairs<V>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                let mut pairs = Vec::new();
                while let Some(pair) = map.next_entry()? {
                    pairs.push(pair);
                }
                Ok(Pairs(pairs))
            }
        }
        deserializer.deserialize_map(Members(std::marker::PhantomData))
    }
}

/// The first key `pairs` gives twice, if any.
fn repeated<V>(pairs: &[(String, V)]) -> Option<&str> {
    let mut seen = std::collections::HashSet::new();
    pairs
        .iter()
        .map(|(key, _)| key.as_str())
        .find(|key| !seen.insert(*key))
}

/// One server's tools in an `allowTools`: a list, or `"*"`.
#[derive(Deserialize)]
#[serde(untagged)]
enum Allowed {
    Tools(Vec<String>),
    All(Star),
}

/// The string `"*"`.
#[derive(Deserialize)]
enum Star {
    #[serde(rename = "*")]
    Star,
}

impl Tokens {
    /// Loads the tokens file at `path` (blocks: a file read).
    ///
    /// # Errors
    ///
    /// [`TokensError`]: the file unreadable or over
    /// [`MAX_CONFIG_BYTES`](psych_mcp::MAX_CONFIG_BYTES), or refused by [`Tokens::parse`].
    pub fn load(path: &Path) -> Result<Self, TokensError> {
        let text = psych_mcp::read_config_text(path).map_err(|source| TokensError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text)
    }

    /// Parses a tokens file's text.
    ///
    /// # Errors
    ///
    /// [`TokensError`]: not the JSON above (unknown keys included), a bad or reserved
    /// identity name, an identity or an `allowTools` server named twice, a digest that is
    /// not `sha256:` and 64 hex digits, a token shared by two identities, or no token at
    /// all.
    pub fn parse(text: &str) -> Result<Self, TokensError> {
        let file: File = serde_json::from_str(text).map_err(TokensError::Shape)?;
        if let Some(name) = repeated(&file.identities.0) {
            return Err(TokensError::IdentityTwice(name.to_owned()));
        }
        let mut by_digest = HashMap::new();
        let mut narrowings = BTreeMap::new();
        // Each name's folder as a case-insensitive file system sees it.
        let mut folders: HashMap<String, String> = HashMap::new();
        for (name, entry) in file.identities.0 {
            let folded = name.to_ascii_lowercase();
            if !crate::tenant::valid_identity(&name)
                || RESERVED_IDENTITIES.contains(&folded.as_str())
            {
                return Err(TokensError::Name(name));
            }
            if let Some(other) = folders.insert(folded, name.clone()) {
                return Err(TokensError::SameFolder(other, name));
            }
            for token in &entry.tokens {
                let digest = parse_digest(token).ok_or_else(|| TokensError::Digest {
                    identity: name.clone(),
                })?;
                if let Some(other) = by_digest.insert(digest, name.clone())
                    && other != name
                {
                    return Err(TokensError::Shared(other, name));
                }
            }
            if let Some(allowed) = entry.allow_tools {
                narrowings.insert(name.clone(), narrowing(&name, allowed)?);
            }
        }
        if by_digest.is_empty() {
            return Err(TokensError::Empty);
        }
        Ok(Self {
            by_digest,
            narrowings,
        })
    }

    /// Each identity whose entry narrows its grant, with what it allows.
    pub(crate) fn narrowings(&self) -> impl Iterator<Item = (&str, &Narrowing)> {
        self.narrowings.iter().map(|(name, n)| (name.as_str(), n))
    }

    /// How many identities the file names (each with at least one token).
    pub fn identities(&self) -> usize {
        self.by_digest
            .values()
            .collect::<std::collections::BTreeSet<_>>()
            .len()
    }

    /// The identity `token` presents, if it is one of the file's.
    pub fn identify(&self, token: &str) -> Option<&str> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        self.by_digest.get(&digest).map(String::as_str)
    }

    /// The identity of a request's `Authorization: Bearer TOKEN` header, if it names one.
    pub(crate) fn identify_header(&self, header: Option<&[u8]>) -> Option<&str> {
        let value = std::str::from_utf8(header?).ok()?;
        let (scheme, token) = value.trim().split_once(' ')?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return None;
        }
        self.identify(token.trim())
    }
}

/// `allowed` as a [`Narrowing`], every name checked.
fn narrowing(identity: &str, allowed: Pairs<Allowed>) -> Result<Narrowing, TokensError> {
    if let Some(server) = repeated(&allowed.0) {
        return Err(TokensError::ServerTwice {
            identity: identity.to_owned(),
            server: server.to_owned(),
        });
    }
    let bad = |name: &str| TokensError::AllowTools {
        identity: identity.to_owned(),
        name: name.to_owned(),
    };
    let mut narrowing = Narrowing::new();
    for (server, tools) in allowed.0 {
        psych_types::ServerId::new(server.clone()).map_err(|_| bad(&server))?;
        let tools = match tools {
            Allowed::All(Star::Star) => None,
            Allowed::Tools(tools) => {
                for tool in &tools {
                    psych_types::ToolName::new(tool.clone()).map_err(|_| bad(tool))?;
                }
                Some(tools)
            }
        };
        narrowing.insert(server, tools);
    }
    Ok(narrowing)
}

/// `sha256:` and 64 hex digits, as the 32 bytes.
fn parse_digest(text: &str) -> Option<[u8; 32]> {
    unhex(text.strip_prefix(SHA256)?)?.try_into().ok()
}

/// The digest of `token` as the tokens file stores it: `sha256:` and 64 hex digits.
pub fn token_digest(token: &str) -> String {
    format!("{SHA256}{}", hex(&Sha256::digest(token.as_bytes())))
}

/// `bytes` as lowercase hex digits.
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
    out
}

/// Hex digits (either case) as bytes; `None` for an odd length or a non-digit.
pub(crate) fn unhex(text: &str) -> Option<Vec<u8>> {
    let text = text.as_bytes();
    if !text.len().is_multiple_of(2) {
        return None;
    }
    text.chunks(2)
        .map(|pair| {
            let digit = |c: u8| char::from(c).to_digit(16);
            u8::try_from(digit(pair[0])? * 16 + digit(pair[1])?).ok()
        })
        .collect()
}

/// A fresh token (`psy_` and 256 random bits in hex) and its digest for the tokens file.
///
/// # Errors
///
/// [`TokensError::Random`]: the system's random source failed.
pub fn new_token() -> Result<(String, String), TokensError> {
    let mut bits = [0u8; 32];
    getrandom::fill(&mut bits).map_err(TokensError::Random)?;
    let token = format!("psy_{}", hex(&bits));
    let digest = token_digest(&token);
    Ok((token, digest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_names_its_identity_and_nothing_else_does() {
        let (token, digest) = new_token().unwrap_or_else(|e| panic!("{e}"));
        let (other, _) = new_token().unwrap_or_else(|e| panic!("{e}"));
        let tokens = Tokens::parse(&format!(
            r#"{{"identities": {{"alice": {{"tokens": ["{digest}"]}}}}}}"#
        ))
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(tokens.identify(&token), Some("alice"));
        assert_eq!(tokens.identify(&other), None);
        let header = format!("Bearer {token}");
        assert_eq!(
            tokens.identify_header(Some(header.as_bytes())),
            Some("alice")
        );
        assert_eq!(tokens.identify_header(Some(token.as_bytes())), None);
        assert_eq!(tokens.identify_header(None), None);
    }

    #[test]
    fn an_identity_may_narrow_its_grant() {
        let digest = token_digest("x");
        let tokens = Tokens::parse(&format!(
            r#"{{"identities": {{"a": {{"tokens": ["{digest}"], "allowTools": {{"gh": ["get_issue"], "fs": "*"}}}}}}}}"#
        ))
        .unwrap_or_else(|e| panic!("{e}"));
        let narrowings: Vec<_> = tokens.narrowings().collect();
        assert_eq!(narrowings.len(), 1);
        let (name, narrowing) = narrowings[0];
        assert_eq!(name, "a");
        assert_eq!(narrowing["gh"], Some(vec!["get_issue".to_owned()]));
        assert_eq!(narrowing["fs"], None);
    }

    #[test]
    fn bad_files_are_refused_saying_why() {
        let digest = token_digest("x");
        for (text, why) in [
            ("{}", "not {"),
            (r#"{"identities": {}}"#, "names no token"),
            (
                &format!(r#"{{"identities": {{"stdio": {{"tokens": ["{digest}"]}}}}}}"#),
                "psych's own",
            ),
            (
                &format!(r#"{{"identities": {{"a/b": {{"tokens": ["{digest}"]}}}}}}"#),
                "is not a name",
            ),
            // One folder where file names ignore case (before, both were accepted).
            (
                &format!(
                    r#"{{"identities": {{"Alice": {{"tokens": ["{digest}"]}}, "alice": {{"tokens": ["{}"]}}}}}}"#,
                    token_digest("y")
                ),
                "differ only in case",
            ),
            (
                &format!(r#"{{"identities": {{"Stdio": {{"tokens": ["{digest}"]}}}}}}"#),
                "psych's own",
            ),
            (
                r#"{"identities": {"a": {"tokens": ["md5:00"]}}}"#,
                "sha256:<64 hex digits>",
            ),
            // Named twice, one entry narrowed: a map kept the last, the whole grant.
            (
                &format!(
                    r#"{{"identities": {{"ci": {{"tokens": ["{digest}"], "allowTools": {{"fs": ["read"]}}}}, "ci": {{"tokens": ["{digest}"]}}}}}}"#
                ),
                "names identity \"ci\" twice",
            ),
            (
                &format!(
                    r#"{{"identities": {{"ci": {{"tokens": ["{digest}"], "allowTools": {{"fs": ["read"], "fs": "*"}}}}}}}}"#
                ),
                "names server \"fs\" twice in allowTools",
            ),
            (
                &format!(
                    r#"{{"identities": {{"a": {{"tokens": ["{digest}"]}}, "b": {{"tokens": ["{digest}"]}}}}}}"#
                ),
                "share a token",
            ),
            (
                &format!(
                    r#"{{"identities": {{"a": {{"tokens": ["{digest}"], "allowTools": {{"s": "all"}}}}}}}}"#
                ),
                "not {",
            ),
            (
                &format!(
                    r#"{{"identities": {{"a": {{"tokens": ["{digest}"], "allowTools": {{"s": ["a b"]}}}}}}}}"#
                ),
                "no server or tool name",
            ),
            (
                &format!(r#"{{"identities": {{"a": {{"tokens": ["{digest}"], "grant": {{}}}}}}}}"#),
                "not {",
            ),
        ] {
            let refused = Tokens::parse(text).expect_err(text);
            assert!(refused.to_string().contains(why), "{text}: {refused}");
        }
    }
}
