//! Which image blocks a request may carry: the type sniffed from the bytes, the dimensions
//! read from the header, and the providers' per-image and per-request limits.
//!
//! An image block is sent only when its bytes are a PNG, JPEG, GIF or WebP image whose
//! header gives its dimensions, and it fits the limits below; any other image (bytes that
//! do not match a supported type, a truncated header, too large, one too many) is sent as
//! its placeholder line instead. The media type sent is the sniffed one, never the declared
//! one, so the bytes always match it.
//!
//! Limits (Anthropic "Vision" guide, searched December 2026; OpenAI's are looser, and one
//! policy keeps both providers' views alike):
//! - at most [`MAX_IMAGE_BASE64`] bytes of base64 per image (5 MB, measured on the encoded
//!   string);
//! - at most [`MAX_SIDE`] pixels on either side;
//! - at most [`MAX_IMAGES`] images per request, and when a request holds more than
//!   [`MANY_IMAGES`], every image must be at most [`MANY_IMAGES_MAX_SIDE`] pixels a side;
//! - at most [`MAX_TOTAL_BASE64`] bytes of base64 images per request, under the 32 MB
//!   request limit with room for the rest.
//!
//! Admission is decided image by image in request order, and an image's decision depends
//! only on the images before it: adding images later in a request never changes whether an
//! earlier one is sent, so the bytes of a prefix stay the same (the prefix property). The
//! "more than 20" rule is kept that way: an image over [`MANY_IMAGES_MAX_SIDE`] is admitted
//! only as one of the first [`MANY_IMAGES`], and once one is admitted the request takes no
//! more than [`MANY_IMAGES`] images in all.

/// The largest base64 length of one image (5 MiB).
pub const MAX_IMAGE_BASE64: usize = 5 * 1024 * 1024;
/// The largest width or height of an image, in pixels.
pub const MAX_SIDE: u32 = 8000;
/// The most images one request carries.
pub const MAX_IMAGES: usize = 100;
/// Above this many images in a request, each must be at most [`MANY_IMAGES_MAX_SIDE`].
pub const MANY_IMAGES: usize = 20;
/// The largest side of every image of a request holding more than [`MANY_IMAGES`].
pub const MANY_IMAGES_MAX_SIDE: u32 = 2000;
/// The most base64 bytes of images one request carries (20 MiB).
pub const MAX_TOTAL_BASE64: usize = 20 * 1024 * 1024;

/// An image format both providers take inline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    Png,
    Jpeg,
    Gif,
    Webp,
}

impl Format {
    pub(crate) fn media_type(self) -> &'static str {
        match self {
            Format::Png => "image/png",
            Format::Jpeg => "image/jpeg",
            Format::Gif => "image/gif",
            Format::Webp => "image/webp",
        }
    }
}

/// What the bytes of an image say it is: its format and its width and height in pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sniffed {
    pub(crate) format: Format,
    pub(crate) width: u32,
    pub(crate) height: u32,
}

fn be16(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from(u16::from_be_bytes([
        *b.get(at)?,
        *b.get(at + 1)?,
    ])))
}

fn le16(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from(u16::from_le_bytes([
        *b.get(at)?,
        *b.get(at + 1)?,
    ])))
}

fn le24(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes([
        *b.get(at)?,
        *b.get(at + 1)?,
        *b.get(at + 2)?,
        0,
    ]))
}

fn be32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Sniffs `data` by its magic bytes and reads its dimensions from its header; `None` when it
/// is not a PNG, JPEG, GIF or WebP whose header is whole, or a side is zero.
pub(crate) fn sniff(data: &[u8]) -> Option<Sniffed> {
    let (format, width, height) = if data.starts_with(b"\x89PNG\r\n\x1a\n") {
        // The IHDR chunk comes first: length 13, type, width, height (big-endian).
        if data.get(12..16)? != b"IHDR" {
            return None;
        }
        (Format::Png, be32(data, 16)?, be32(data, 20)?)
    } else if data.starts_with(b"GIF87a") || data.starts_with(b"GIF89a") {
        (Format::Gif, le16(data, 6)?, le16(data, 8)?)
    } else if data.starts_with(b"\xff\xd8\xff") {
        let (width, height) = jpeg_size(data)?;
        (Format::Jpeg, width, height)
    } else if data.get(..4)? == b"RIFF" && data.get(8..12)? == b"WEBP" {
        let (width, height) = webp_size(data)?;
        (Format::Webp, width, height)
    } else {
        return None;
    };
    (width > 0 && height > 0).then_some(Sniffed {
        format,
        width,
        height,
    })
}

/// Walks the JPEG markers to the first start-of-frame and reads its height and width.
fn jpeg_size(data: &[u8]) -> Option<(u32, u32)> {
    let mut at = 2;
    loop {
        // Markers may be padded with 0xFF bytes.
        while *data.get(at)? == 0xff && *data.get(at + 1)? == 0xff {
            at += 1;
        }
        if *data.get(at)? != 0xff {
            return None;
        }
        let marker = *data.get(at + 1)?;
        match marker {
            // Markers without a length.
            0x01 | 0xd0..=0xd7 => at += 2,
            // Start of frame (not DHT 0xC4, JPG 0xC8, DAC 0xCC).
            0xc0..=0xcf if !matches!(marker, 0xc4 | 0xc8 | 0xcc) => {
                let height = be16(data, at + 5)?;
                let width = be16(data, at + 7)?;
                return Some((width, height));
            }
            // End of image or start of scan before any frame: no size.
            0xd9 | 0xda => return None,
            _ => {
                let len = be16(data, at + 2)? as usize;
                if len < 2 {
                    return None;
                }
                at += 2 + len;
            }
        }
    }
}

/// Reads a WebP's canvas size from its first chunk (`VP8 `, `VP8L` or `VP8X`).
fn webp_size(data: &[u8]) -> Option<(u32, u32)> {
    match data.get(12..16)? {
        b"VP8 " => {
            // Frame tag (3 bytes), start code 9D 01 2A, then 14-bit width and height.
            if data.get(23..26)? != [0x9d, 0x01, 0x2a] {
                return None;
            }
            Some((le16(data, 26)? & 0x3fff, le16(data, 28)? & 0x3fff))
        }
        b"VP8L" => {
            if *data.get(20)? != 0x2f {
                return None;
            }
            let bits = u32::from_le_bytes(data.get(21..25)?.try_into().ok()?);
            Some(((bits & 0x3fff) + 1, ((bits >> 14) & 0x3fff) + 1))
        }
        b"VP8X" => Some((le24(data, 24)? + 1, le24(data, 27)? + 1)),
        _ => None,
    }
}

/// The images admitted so far in one request, deciding each next one.
#[derive(Debug, Default)]
pub(crate) struct Budget {
    count: usize,
    base64: usize,
    any_large: bool,
}

impl Budget {
    /// Whether the image `data` may be sent as the next image of the request: its sniffed
    /// media type when it is, counted in; `None` (and nothing counted) when it is not.
    /// `gif` says whether GIF is accepted (OpenAI takes only non-animated GIF, which the
    /// header alone cannot tell, so its renderer refuses GIF).
    pub(crate) fn admit(&mut self, data: &[u8], gif: bool) -> Option<&'static str> {
        let sniffed = sniff(data)?;
        if sniffed.format == Format::Gif && !gif {
            return None;
        }
        let encoded = data.len().div_ceil(3) * 4;
        let side = sniffed.width.max(sniffed.height);
        let large = side > MANY_IMAGES_MAX_SIDE;
        let count = self.count + 1;
        let fits = encoded <= MAX_IMAGE_BASE64
            && side <= MAX_SIDE
            && self.base64 + encoded <= MAX_TOTAL_BASE64
            && (count <= MANY_IMAGES || (count <= MAX_IMAGES && !large && !self.any_large));
        if !fits {
            return None;
        }
        self.count = count;
        self.base64 += encoded;
        self.any_large |= large;
        Some(sniffed.format.media_type())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn png(width: u32, height: u32) -> Vec<u8> {
        let mut out = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
        out.extend_from_slice(&width.to_be_bytes());
        out.extend_from_slice(&height.to_be_bytes());
        out.extend_from_slice(&[8, 6, 0, 0, 0, 0, 0, 0, 0]);
        out
    }

    #[test]
    fn headers_give_type_and_size() {
        assert_eq!(
            sniff(&png(3, 2)),
            Some(Sniffed {
                format: Format::Png,
                width: 3,
                height: 2
            })
        );
        let gif = b"GIF89a\x05\x00\x07\x00\x80\x00\x00";
        assert_eq!(sniff(gif).map(|s| (s.width, s.height)), Some((5, 7)));
        // SOI, APP0 (length 16), SOF0: precision 8, height 0x0102, width 0x0304.
        let mut jpeg = vec![0xff, 0xd8, 0xff, 0xe0, 0, 16];
        jpeg.extend_from_slice(&[0; 14]);
        jpeg.extend_from_slice(&[0xff, 0xc0, 0, 17, 8, 1, 2, 3, 4, 3]);
        assert_eq!(
            sniff(&jpeg).map(|s| (s.width, s.height)),
            Some((0x0304, 0x0102))
        );
        let mut webp = b"RIFF\0\0\0\0WEBPVP8X\x0a\0\0\0\0\0\0\0".to_vec();
        webp.extend_from_slice(&[99, 0, 0, 49, 0, 0]);
        assert_eq!(sniff(&webp).map(|s| (s.width, s.height)), Some((100, 50)));
    }

    #[test]
    fn bytes_that_are_not_a_whole_image_header_are_refused() {
        for data in [
            &b"\x89PNG\r"[..],
            b"\x89PNG\r\n\x1a\n",
            b"GIF89a\x05",
            b"\xff\xd8\xff\xd9",
            b"RIFF\0\0\0\0WEBPVP8 ",
            b"<svg/>",
            b"",
        ] {
            assert_eq!(sniff(data), None, "{data:?}");
        }
        assert_eq!(sniff(&png(0, 5)), None, "a zero side");
    }

    #[test]
    fn the_budget_keeps_earlier_decisions_and_the_many_images_rule() {
        let mut budget = Budget::default();
        assert_eq!(budget.admit(&png(4000, 100), true), Some("image/png"));
        assert_eq!(budget.admit(&png(9000, 100), true), None, "over 8000 px");
        for _ in 1..MANY_IMAGES {
            assert!(budget.admit(&png(10, 10), true).is_some());
        }
        // A 21st image would make the 4000 px one illegal: refused, small or not.
        assert_eq!(budget.admit(&png(10, 10), true), None);

        let mut budget = Budget::default();
        for _ in 0..MAX_IMAGES {
            assert!(budget.admit(&png(2000, 2000), true).is_some());
        }
        assert_eq!(budget.admit(&png(10, 10), true), None, "the 101st");

        let mut budget = Budget::default();
        assert_eq!(budget.admit(b"GIF89a\x05\x00\x07\x00", false), None);
        let mut big = png(10, 10);
        big.resize(MAX_IMAGE_BASE64 / 4 * 3 + 1, 0);
        assert_eq!(budget.admit(&big, true), None, "over 5 MB of base64");
        big.truncate(MAX_IMAGE_BASE64 / 4 * 3);
        assert!(budget.admit(&big, true).is_some(), "exactly 5 MB of base64");
    }
}
