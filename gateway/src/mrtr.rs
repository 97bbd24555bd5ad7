//! MCP 2026-07-28's multi-round-trip calls (MRTR) through the gateway: the `requestState`
//! it hands its client, sealed.
//!
//! An upstream that needs the client's input answers `input_required` with its own
//! `requestState`. The upstream can bind that state only to psych, the one client it sees,
//! which every identity of the gateway shares; and the spec has the server treat the state
//! a client echoes as attacker-controlled. So the gateway never hands the upstream's state
//! out as it is: it seals it ([`Sealer::seal`]) in a state of its own, bound to
//!
//! - the identity the round was answered to,
//! - the tool name the client called (a direct tool's, or `psych_call_tool`'s) and a
//!   SHA-256 digest of its arguments (canonical JSON: sorted keys),
//! - the upstream tool the call reached (a retry must reach it again),
//! - an expiry ([`STATE_TTL`] after the round),
//! - and the upstream's own state, echoed upstream byte for byte on the retry (none when
//!   the upstream sent none).
//!
//! The seal is `psy1.<payload in hex>.<HMAC-SHA256 in hex>`: the payload is the JSON of
//! those fields, the MAC is keyed with 32 random bytes drawn when the process starts (so a
//! restart invalidates every state handed out before it, as a clear error), or with the key
//! the settings give ([`GatewaySettings::request_state_key`](crate::GatewaySettings::request_state_key):
//! replicas sharing one, as `psych serve --store` does through the store, open each
//! other's states, and a restart keeps them good). The payload is
//! readable by the client (hex, not encrypted): the upstream's own state in it is what a
//! client talking to the upstream directly would hold anyway, and nothing else in it is
//! secret. A state over [`MAX_STATE`] is refused before it is decoded. [`Sealer::open`] checks the MAC in constant time before reading anything, then
//! the expiry, the identity and the call; every failure is a [`StateError`], which the
//! gateway answers as JSON-RPC -32602 before the call runs.
//!
//! The HMAC is RFC 2104's over sha2 (a dozen lines, checked against RFC 4231's vectors):
//! the workspace has no `hmac` crate, and one construction does not warrant a dependency.

use std::time::Duration;

use psych_types::ToolRef;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::tokens::{hex, unhex};

/// How long a sealed `requestState` is good for after its round: a person answering an
/// elicitation has this long to answer.
pub(crate) const STATE_TTL: Duration = Duration::from_secs(600);

/// What every sealed state starts with: its format (a later format gets a new prefix).
const PREFIX: &str = "psy1.";

/// SHA-256's block size, in bytes: HMAC's pad length.
const BLOCK: usize = 64;

/// What a round is bound to, checked again when the client retries it.
#[derive(Debug, Clone)]
pub(crate) struct Binding<'a> {
    /// The identity answered.
    pub(crate) identity: &'a str,
    /// The tool name the client called.
    pub(crate) name: &'a str,
    /// The arguments the client called it with, as their [`digest`] (the call holds
    /// them, not the binding).
    pub(crate) arguments: String,
}

impl Binding<'_> {
    /// The binding's parts, owned, to move to a blocking thread: `(identity, name,
    /// arguments)`, borrowed back with [`Binding::of`].
    pub(crate) fn owned(&self) -> (String, String, String) {
        (
            self.identity.to_owned(),
            self.name.to_owned(),
            self.arguments.clone(),
        )
    }

    /// The binding of parts [`Binding::owned`] took.
    pub(crate) fn of((identity, name, arguments): &(String, String, String)) -> Binding<'_> {
        Binding {
            identity,
            name,
            arguments: arguments.clone(),
        }
    }
}

/// What a state opened holds: where the retry must go and what to echo upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Opened {
    /// The upstream tool the round reached.
    pub(crate) target: ToolRef,
    /// The upstream's own `requestState`, exactly as it sent it; `None` if it sent none.
    pub(crate) upstream: Option<String>,
}

/// Why a client's `requestState` was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum StateError {
    /// Not a state this gateway sealed: forged, altered, truncated, sealed before the
    /// gateway restarted (its key is drawn at each start), or by a replica with another key
    /// ([`GatewaySettings::request_state_key`](crate::GatewaySettings::request_state_key)).
    #[error(
        "requestState was not issued by this gateway (it is altered, from before the gateway \
         restarted, or from another one): call the tool again without inputResponses and \
         requestState"
    )]
    Unsealed,
    /// Sealed more than [`STATE_TTL`] ago.
    #[error(
        "requestState expired (it is good for {} seconds): call the tool again without \
         inputResponses and requestState",
        STATE_TTL.as_secs()
    )]
    Expired,
    /// Sealed for another identity.
    #[error("requestState was issued to another identity")]
    OtherIdentity,
    /// Sealed for another tool name or other arguments.
    #[error(
        "requestState was issued for another call: a retry repeats the tool name and the \
         arguments of the call that got it"
    )]
    OtherCall,
    /// Longer than any state this gateway seals ([`MAX_STATE`]): refused before it is read.
    #[error("requestState is {len} bytes, over the {max} a state of this gateway can be")]
    TooLarge {
        /// Its length.
        len: usize,
        /// [`MAX_STATE`].
        max: usize,
    },
    /// `inputResponses` came without the `requestState` of the round they answer.
    #[error(
        "inputResponses came without requestState: a retry sends back the requestState of \
         the input_required result it answers"
    )]
    Missing,
}

/// The longest `requestState` [`Sealer::open`] reads (1 MiB: hex doubles the upstream's
/// own state, JSON-escaped, so an upstream state up to about 500 KiB travels): a longer one
/// is refused before it is decoded, and one the gateway would seal longer is not handed
/// out (the call fails naming the upstream).
pub(crate) const MAX_STATE: usize = 1 << 20;

/// The sealed payload, as JSON. Field names are short: the state travels on every retry.
#[derive(Debug, Serialize, Deserialize)]
struct Payload {
    /// The identity.
    id: String,
    /// The tool name the client called.
    name: String,
    /// SHA-256 of the arguments' canonical JSON, in hex.
    args: String,
    /// The upstream server.
    server: String,
    /// The upstream tool.
    tool: String,
    /// Expiry, Unix milliseconds.
    exp: u64,
    /// The upstream's own state.
    up: Option<String>,
}

/// Seals and opens the gateway's `requestState`s with a key of its process, or one it was
/// given. Each costs about its state's size (hex, HMAC-SHA256, JSON): a state past
/// [`DIGEST_ON_WORKER`] is sealed or opened on a blocking thread ([`Binding::owned`]).
#[derive(Clone)]
pub(crate) struct Sealer {
    key: [u8; 32],
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sealer").finish_non_exhaustive()
    }
}

impl Sealer {
    /// A sealer with a fresh key from the system's random source.
    ///
    /// # Errors
    ///
    /// The random source failed.
    pub(crate) fn new() -> Result<Self, getrandom::Error> {
        let mut key = [0u8; 32];
        getrandom::fill(&mut key)?;
        Ok(Self { key })
    }

    /// A sealer with `key`, shared with other gateways that seal with it.
    pub(crate) fn with_key(key: [u8; 32]) -> Self {
        Self { key }
    }

    /// The state to hand the client for a round of `binding`'s call that reached `target`
    /// and got `upstream` (the upstream's own state), at `now` (Unix milliseconds).
    pub(crate) fn seal(
        &self,
        binding: &Binding<'_>,
        target: &ToolRef,
        upstream: Option<&str>,
        now: u64,
    ) -> String {
        let payload = Payload {
            id: binding.identity.to_owned(),
            name: binding.name.to_owned(),
            args: binding.arguments.clone(),
            server: target.server.to_string(),
            tool: target.tool.to_string(),
            exp: now.saturating_add(u64::try_from(STATE_TTL.as_millis()).unwrap_or(u64::MAX)),
            up: upstream.map(str::to_owned),
        };
        // A struct of strings and a number always serializes.
        let bytes = serde_json::to_vec(&payload).unwrap_or_default();
        let mac = self.mac(&bytes);
        format!("{PREFIX}{}.{}", hex(&bytes), hex(&mac))
    }

    /// Opens `state`, a client's `requestState`, for a retry of `binding`'s call at `now`.
    ///
    /// # Errors
    ///
    /// A [`StateError`]: the MAC is checked first, so nothing of an unsealed state is read.
    pub(crate) fn open(
        &self,
        state: &str,
        binding: &Binding<'_>,
        now: u64,
    ) -> Result<Opened, StateError> {
        if state.len() > MAX_STATE {
            return Err(StateError::TooLarge {
                len: state.len(),
                max: MAX_STATE,
            });
        }
        let sealed = state.strip_prefix(PREFIX).ok_or(StateError::Unsealed)?;
        let (payload, mac) = sealed.split_once('.').ok_or(StateError::Unsealed)?;
        let payload = unhex(payload).ok_or(StateError::Unsealed)?;
        let mac = unhex(mac).ok_or(StateError::Unsealed)?;
        if !same(&self.mac(&payload), &mac) {
            return Err(StateError::Unsealed);
        }
        let payload: Payload =
            serde_json::from_slice(&payload).map_err(|_| StateError::Unsealed)?;
        if payload.exp < now {
            return Err(StateError::Expired);
        }
        if payload.id != binding.identity {
            return Err(StateError::OtherIdentity);
        }
        if payload.name != binding.name
            || !same(payload.args.as_bytes(), binding.arguments.as_bytes())
        {
            return Err(StateError::OtherCall);
        }
        let target =
            ToolRef::parse(&payload.server, &payload.tool).map_err(|_| StateError::Unsealed)?;
        Ok(Opened {
            target,
            upstream: payload.up,
        })
    }

    /// HMAC-SHA256 of `PREFIX` and `message` under the process's key.
    fn mac(&self, message: &[u8]) -> [u8; 32] {
        hmac_sha256(&self.key, &[PREFIX.as_bytes(), message])
    }
}

/// HMAC-SHA256 (RFC 2104) of the concatenated `parts` under `key`.
fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut block = [0u8; BLOCK];
    if key.len() > BLOCK {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let mut inner = Sha256::new();
    inner.update(block.map(|b| b ^ 0x36));
    for part in parts {
        inner.update(part);
    }
    let mut outer = Sha256::new();
    outer.update(block.map(|b| b ^ 0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

/// Whether `a` and `b` are equal, in time that depends on their lengths only.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

/// The most bytes of JSON arguments digested on an async worker, roughly (as
/// [`psych_mcp::wire::value_past`] counts them, which may be a few times under their
/// canonical JSON for arrays of numbers): 64 KiB, under a millisecond to a few; larger
/// ones are digested on a blocking thread.
pub(crate) const DIGEST_ON_WORKER: usize = 64 * 1024;

/// SHA-256 of `arguments`' canonical JSON (sorted keys, compact), in hex: what a
/// [`Binding`] holds of them. CPU work of about 10 ms a MiB of JSON.
pub(crate) fn digest(arguments: &Value) -> String {
    hex(&Sha256::digest(
        psych_types::json::to_compact(arguments).as_bytes(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn hmac_matches_rfc_4231() {
        // Test case 2: a key shorter than the block.
        assert_eq!(
            hex(&hmac_sha256(
                b"Jefe",
                &[b"what do ya want ", b"for nothing?"]
            )),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        // Test case 6: a key longer than the block is hashed first.
        assert_eq!(
            hex(&hmac_sha256(
                &[0xaa; 131],
                &[b"Test Using Larger Than Block-Size Key - Hash Key First"]
            )),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    fn binding<'a>(identity: &'a str, name: &'a str, arguments: &Value) -> Binding<'a> {
        Binding {
            identity,
            name,
            arguments: digest(arguments),
        }
    }

    #[test]
    fn a_state_opens_only_for_its_identity_call_and_time() {
        let sealer = Sealer::new().unwrap();
        let target = ToolRef::parse("up", "confirm").unwrap();
        let args = json!({"text": "hi", "n": 1});
        // Key order does not matter: the digest is of the canonical JSON.
        let reordered = json!({"n": 1, "text": "hi"});
        let upstream = "confirm:hi:+/=";
        let state = sealer.seal(
            &binding("alice", "up__confirm", &args),
            &target,
            Some(upstream),
            1000,
        );
        assert!(state.starts_with(PREFIX));
        let opened = sealer
            .open(&state, &binding("alice", "up__confirm", &reordered), 2000)
            .unwrap();
        assert_eq!(opened.target, target);
        assert_eq!(opened.upstream.as_deref(), Some(upstream));
        let ttl = u64::try_from(STATE_TTL.as_millis()).unwrap();
        assert_eq!(
            sealer.open(
                &state,
                &binding("alice", "up__confirm", &args),
                1000 + ttl + 1
            ),
            Err(StateError::Expired)
        );
        assert_eq!(
            sealer.open(&state, &binding("bob", "up__confirm", &args), 2000),
            Err(StateError::OtherIdentity)
        );
        assert_eq!(
            sealer.open(&state, &binding("alice", "up__echo", &args), 2000),
            Err(StateError::OtherCall)
        );
        let other = json!({"text": "bye", "n": 1});
        assert_eq!(
            sealer.open(&state, &binding("alice", "up__confirm", &other), 2000),
            Err(StateError::OtherCall)
        );
        // No upstream state: none is echoed.
        let bare = sealer.seal(&binding("alice", "up__confirm", &args), &target, None, 1000);
        let opened = sealer.open(&bare, &binding("alice", "up__confirm", &args), 2000);
        assert_eq!(opened.unwrap().upstream, None);
    }

    #[test]
    fn an_altered_or_foreign_state_is_unsealed() {
        let sealer = Sealer::new().unwrap();
        let target = ToolRef::parse("up", "confirm").unwrap();
        let args = json!({});
        let bound = binding("alice", "up__confirm", &args);
        let state = sealer.seal(&bound, &target, Some("s"), 1000);
        // Another process (a restart) has another key.
        let restarted = Sealer::new().unwrap();
        assert_eq!(
            restarted.open(&state, &bound, 2000),
            Err(StateError::Unsealed)
        );
        // Replicas given one key open each other's states; a key of its own does not.
        let key = [7; 32];
        let shared = Sealer::with_key(key).seal(&bound, &target, Some("s"), 1000);
        assert!(Sealer::with_key(key).open(&shared, &bound, 2000).is_ok());
        assert_eq!(
            Sealer::with_key([8; 32]).open(&shared, &bound, 2000),
            Err(StateError::Unsealed)
        );
        // The payload re-encoded for another identity, the MAC kept.
        let (payload, mac) = state[PREFIX.len()..].split_once('.').unwrap();
        let text = String::from_utf8(unhex(payload).unwrap()).unwrap();
        let forged = format!(
            "{PREFIX}{}.{mac}",
            hex(text.replace("alice", "mallory").as_bytes())
        );
        let as_mallory = binding("mallory", "up__confirm", &args);
        assert_eq!(
            sealer.open(&forged, &as_mallory, 2000),
            Err(StateError::Unsealed)
        );
        let other_format = state.replace(PREFIX, "psy2.");
        for bad in [
            "",
            "s",
            "psy1.",
            "psy1.zz.00",
            "psy1.0.00",
            &state[..state.len() - 2],
            other_format.as_str(),
        ] {
            assert_eq!(
                sealer.open(bad, &bound, 2000),
                Err(StateError::Unsealed),
                "{bad}"
            );
        }
        // Past the bound: refused by its length, before anything is decoded.
        let huge = format!("{PREFIX}{}", "0".repeat(MAX_STATE));
        assert_eq!(
            sealer.open(&huge, &bound, 2000),
            Err(StateError::TooLarge {
                len: huge.len(),
                max: MAX_STATE
            })
        );
    }
}
