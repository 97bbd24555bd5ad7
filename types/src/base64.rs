//! Standard padded base64 (RFC 4648 §4), the serde form of binary tool output.
//!
//! Small enough to keep here rather than take a dependency for one field. Private: the
//! crate's surface is the serde form of [`ContentBlock`](crate::ContentBlock) (decoding
//! happens there, a block with bad base64 kept whole as
//! [`ContentBlock::Unknown`](crate::ContentBlock::Unknown)) and
//! [`encode_base64`](crate::encode_base64), which renderers need to write binary content
//! into a request.

use serde::{Deserialize, Deserializer, Serializer};

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Encodes bytes as standard padded base64 (RFC 4648 §4): the form MCP carries binary
/// content in (an image's `data`, a resource's `blob`) and provider requests send images
/// in. Decoding is the serde form of [`ContentBlock`](crate::ContentBlock)'s job.
///
/// ```
/// assert_eq!(psych_types::encode_base64(b"foob"), "Zm9vYg==");
/// ```
pub fn encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Why a string is not standard padded base64.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum Base64Error {
    /// The length is not a multiple of four.
    #[error("base64 length {0} is not a multiple of 4")]
    Length(usize),
    /// A byte outside the alphabet, or padding in the wrong place.
    #[error("invalid base64 byte {byte:#04x} at offset {at}")]
    Byte {
        /// The offending byte.
        byte: u8,
        /// Its offset in the input.
        at: usize,
    },
}

fn value(byte: u8) -> Option<u32> {
    let v = match byte {
        b'A'..=b'Z' => byte - b'A',
        b'a'..=b'z' => byte - b'a' + 26,
        b'0'..=b'9' => byte - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => return None,
    };
    Some(u32::from(v))
}

/// Decodes standard padded base64.
///
/// # Errors
///
/// [`Base64Error`] on a bad length, a byte outside the alphabet, or misplaced padding.
pub(crate) fn decode(text: &str) -> Result<Vec<u8>, Base64Error> {
    let input = text.as_bytes();
    if !input.len().is_multiple_of(4) {
        return Err(Base64Error::Length(input.len()));
    }
    let mut out = Vec::with_capacity(input.len() / 4 * 3);
    let quads = input.len() / 4;
    for (q, quad) in input.chunks_exact(4).enumerate() {
        let last = q + 1 == quads;
        let pad = if last {
            quad.iter().rev().take_while(|&&b| b == b'=').count()
        } else {
            0
        };
        if pad > 2 {
            return Err(Base64Error::Byte {
                byte: b'=',
                at: q * 4 + 1,
            });
        }
        let mut n = 0u32;
        for (i, &byte) in quad[..4 - pad].iter().enumerate() {
            let v = value(byte).ok_or(Base64Error::Byte {
                byte,
                at: q * 4 + i,
            })?;
            n |= v << (18 - 6 * i);
        }
        let bytes = n.to_be_bytes();
        out.extend_from_slice(&bytes[1..4 - pad]);
    }
    Ok(out)
}

pub(crate) fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&encode(bytes))
}

pub(crate) fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
    let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
    decode(&text).map_err(serde::de::Error::custom)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc4648_vectors() {
        for (plain, coded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(encode(plain.as_bytes()), coded);
            assert_eq!(decode(coded).unwrap(), plain.as_bytes());
        }
    }

    #[test]
    fn bad_input_is_a_typed_error() {
        assert_eq!(decode("Zm9"), Err(Base64Error::Length(3)));
        assert_eq!(decode("Zm9*"), Err(Base64Error::Byte { byte: b'*', at: 3 }));
        assert!(decode("Zg==Zm9v").is_err());
        assert!(decode("Z===").is_err());
    }

    proptest::proptest! {
        #[test]
        fn round_trips(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..300)) {
            proptest::prop_assert_eq!(decode(&encode(&bytes)).unwrap(), bytes);
        }
    }
}
