//! Real encoded test images, made in code: a PNG encoder (zlib stored blocks, CRC-32,
//! Adler-32), a baseline JPEG of one 8×8 block, the classic 1×1 GIF, and WebP headers. No
//! binary file and no dependency.

/// CRC-32 (IEEE, reflected 0xEDB88320), as PNG chunks use it.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

fn adler32(bytes: &[u8]) -> u32 {
    let (mut a, mut b) = (1u32, 0u32);
    for &x in bytes {
        a = (a + u32::from(x)) % 65_521;
        b = (b + a) % 65_521;
    }
    (b << 16) | a
}

fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    let start = out.len();
    out.extend_from_slice(kind);
    out.extend_from_slice(data);
    let crc = crc32(&out[start..]);
    out.extend_from_slice(&crc.to_be_bytes());
}

/// A valid RGB PNG of `width` × `height` pixels, colours from `seed`: every decoder reads
/// it (zlib stream of stored blocks, filter type 0 on every row).
pub fn png(width: u32, height: u32, seed: u8) -> Vec<u8> {
    let mut raw = Vec::with_capacity((height * (1 + width * 3)) as usize);
    for y in 0..height {
        raw.push(0);
        for x in 0..width {
            raw.extend_from_slice(&[
                seed.wrapping_add(x as u8),
                seed.wrapping_mul(3).wrapping_add(y as u8),
                (x ^ y) as u8,
            ]);
        }
    }
    let mut zlib = vec![0x78, 0x01];
    let blocks: Vec<&[u8]> = raw.chunks(65_535).collect();
    for (i, block) in blocks.iter().enumerate() {
        zlib.push(u8::from(i + 1 == blocks.len()));
        let len = block.len() as u16;
        zlib.extend_from_slice(&len.to_le_bytes());
        zlib.extend_from_slice(&(!len).to_le_bytes());
        zlib.extend_from_slice(block);
    }
    if blocks.is_empty() {
        zlib.extend_from_slice(&[1, 0, 0, 0xff, 0xff]);
    }
    zlib.extend_from_slice(&adler32(&raw).to_be_bytes());
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&width.to_be_bytes());
    ihdr.extend_from_slice(&height.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    chunk(&mut out, b"IHDR", &ihdr);
    chunk(&mut out, b"IDAT", &zlib);
    chunk(&mut out, b"IEND", &[]);
    out
}

/// A PNG whose header says `width` × `height` but which holds one row of pixel data: enough
/// for a header-reading check, without allocating a huge image.
pub fn png_header(width: u32, height: u32) -> Vec<u8> {
    let mut out = png(1, 1, 0);
    out[16..20].copy_from_slice(&width.to_be_bytes());
    out[20..24].copy_from_slice(&height.to_be_bytes());
    out
}

/// A valid baseline JPEG: one 8×8 grey block (every coefficient zero), Huffman tables of one
/// code each.
pub fn jpeg() -> Vec<u8> {
    let mut out = vec![0xff, 0xd8];
    // DQT: table 0, 64 ones.
    out.extend_from_slice(&[0xff, 0xdb, 0, 67, 0]);
    out.extend_from_slice(&[1; 64]);
    // SOF0: precision 8, height 8, width 8, one component (id 1, 1x1, table 0).
    out.extend_from_slice(&[0xff, 0xc0, 0, 11, 8, 0, 8, 0, 8, 1, 1, 0x11, 0]);
    // DHT: DC table 0 and AC table 0, each one code of length 1 (symbol 0).
    for class in [0x00, 0x10] {
        out.extend_from_slice(&[0xff, 0xc4, 0, 20, class, 1]);
        out.extend_from_slice(&[0; 15]);
        out.push(0);
    }
    // SOS, then the scan: DC difference 0 ("0"), end of block ("0"), padded with ones.
    out.extend_from_slice(&[0xff, 0xda, 0, 8, 1, 1, 0x00, 0, 63, 0]);
    out.push(0x3f);
    out.extend_from_slice(&[0xff, 0xd9]);
    out
}

/// The classic 1×1 GIF89a.
pub fn gif() -> Vec<u8> {
    b"GIF89a\x01\x00\x01\x00\x80\x00\x00\xff\xff\xff\x00\x00\x00\x2c\x00\x00\x00\x00\x01\x00\x01\x00\x00\x02\x02\x44\x01\x00\x3b"
        .to_vec()
}

/// A WebP `VP8X` header of a `width` × `height` canvas (header only: for sniffing checks).
pub fn webp_header(width: u32, height: u32) -> Vec<u8> {
    let mut out = b"RIFF\x16\x00\x00\x00WEBPVP8X\x0a\x00\x00\x00\x00\x00\x00\x00".to_vec();
    out.extend_from_slice(&(width - 1).to_le_bytes()[..3]);
    out.extend_from_slice(&(height - 1).to_le_bytes()[..3]);
    out
}
