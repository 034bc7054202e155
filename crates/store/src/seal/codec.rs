//! The codecs a sealed record's payload may be compressed with before it
//! is encrypted (`[store] compression`): zstd or LZ4. Each has its own
//! flag in the sealed plaintext, so opening never depends on the setting:
//! an instance opens what either codec sealed, whichever one it seals with.

use std::cell::RefCell;

use serde::Deserialize;

/// zstd's level: 3, its default. On a 2 KiB payment object it comes
/// within 3 % of level 9 (973 against 944 bytes) and 5 % of level 19, and
/// level 1 costs about as much CPU at this size.
const ZSTD_LEVEL: i32 = 3;

/// How a sealed payload is compressed (`[store] compression`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Codec {
    /// LZ4's block format (`lz4_flex`, no unsafe code): a few times less
    /// CPU than zstd, for somewhat larger records.
    Lz4,
    /// zstd at level 3: the smallest records.
    Zstd,
}

impl Codec {
    /// Both codecs, in the order the book names them.
    pub const ALL: [Codec; 2] = [Codec::Lz4, Codec::Zstd];

    /// The name `[store] compression` takes.
    pub const fn name(self) -> &'static str {
        match self {
            Codec::Lz4 => "lz4",
            Codec::Zstd => "zstd",
        }
    }

    /// The plaintext's flag for a payload compressed with this codec
    /// (`0` is an uncompressed payload). zstd's is the `1` every sealed
    /// record had before LZ4 was added, so those records still open.
    pub(super) const fn flag(self) -> u8 {
        match self {
            Codec::Zstd => 1,
            Codec::Lz4 => 2,
        }
    }

    /// The codec a plaintext's flag names; `None`: no codec does.
    pub(super) fn from_flag(flag: u8) -> Option<Codec> {
        Codec::ALL.into_iter().find(|c| c.flag() == flag)
    }

    /// `payload` compressed; `None` if the codec failed.
    pub(super) fn compress(self, payload: &[u8]) -> Option<Vec<u8>> {
        match self {
            Codec::Zstd => zstd_compress(payload),
            Codec::Lz4 => Some(lz4_flex::block::compress(payload)),
        }
    }

    /// `compressed` expanded: `None` unless it comes to exactly `len`
    /// bytes (it never writes more than `len`).
    pub(super) fn decompress(self, compressed: &[u8], len: usize) -> Option<Vec<u8>> {
        let expanded = match self {
            Codec::Zstd => zstd_decompress(compressed, len)?,
            Codec::Lz4 => lz4_flex::block::decompress(compressed, len).ok()?,
        };
        (expanded.len() == len).then_some(expanded)
    }
}

thread_local! {
    /// This thread's zstd contexts, kept: making one per record cost more
    /// than the work on a 2 KiB object (a seal took 30 µs instead of about
    /// 15, an open 25 instead of about 6, in a release build). Each holds
    /// what its largest input needed. (LZ4's block API needs none.)
    static COMPRESSOR: RefCell<Option<zstd::bulk::Compressor<'static>>> = const { RefCell::new(None) };
    static DECOMPRESSOR: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
}

/// `payload` compressed at [`ZSTD_LEVEL`] with this thread's context.
fn zstd_compress(payload: &[u8]) -> Option<Vec<u8>> {
    COMPRESSOR.with(|cell| {
        let mut cell = cell.borrow_mut();
        if cell.is_none() {
            *cell = zstd::bulk::Compressor::new(ZSTD_LEVEL).ok();
        }
        cell.as_mut()?.compress(payload).ok()
    })
}

/// `compressed` expanded to at most `len` bytes with this thread's context.
fn zstd_decompress(compressed: &[u8], len: usize) -> Option<Vec<u8>> {
    DECOMPRESSOR.with(|cell| {
        let mut cell = cell.borrow_mut();
        if cell.is_none() {
            *cell = zstd::bulk::Decompressor::new().ok();
        }
        cell.as_mut()?.decompress(compressed, len).ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A JSON-ish payload that both codecs shrink.
    fn payload() -> Vec<u8> {
        crate::seal::fixture::payment_intent("customer-1842").into_bytes()
    }

    #[test]
    fn each_codec_round_trips_and_shrinks_json() {
        let payload = payload();
        for codec in Codec::ALL {
            let packed = codec.compress(&payload).unwrap();
            assert!(packed.len() < payload.len(), "{codec:?}");
            assert_eq!(
                codec.decompress(&packed, payload.len()).unwrap(),
                payload,
                "{codec:?}"
            );
        }
    }

    /// The stored length is a bound, and an exact one: a payload that
    /// expands to more, or to less, is refused.
    #[test]
    fn a_wrong_length_is_refused() {
        let payload = payload();
        for codec in Codec::ALL {
            let packed = codec.compress(&payload).unwrap();
            for len in [payload.len() - 1, payload.len() + 1, 0] {
                assert_eq!(codec.decompress(&packed, len), None, "{codec:?} {len}");
            }
        }
    }

    /// One codec's bytes do not expand under the other.
    #[test]
    fn the_codecs_do_not_read_each_other() {
        let payload = payload();
        let zstd = Codec::Zstd.compress(&payload).unwrap();
        let lz4 = Codec::Lz4.compress(&payload).unwrap();
        assert_eq!(Codec::Lz4.decompress(&zstd, payload.len()), None);
        assert_eq!(Codec::Zstd.decompress(&lz4, payload.len()), None);
    }

    #[test]
    fn flags_are_distinct_and_zstd_keeps_the_first() {
        assert_eq!(Codec::Zstd.flag(), 1);
        for codec in Codec::ALL {
            assert_ne!(codec.flag(), 0);
            assert_eq!(Codec::from_flag(codec.flag()), Some(codec));
        }
        assert_eq!(Codec::from_flag(0), None);
        assert_eq!(Codec::from_flag(3), None);
    }
}
