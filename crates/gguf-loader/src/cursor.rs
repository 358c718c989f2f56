//! A bounds-checked little-endian reader over a byte slice.
//!
//! Every read checks the remaining length with checked arithmetic and reports truncation with
//! the offset and what was being read, so a cut-off download names where it was cut.

use crate::GgufError;

pub(crate) struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Cursor { bytes, pos: 0 }
    }

    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    /// The bytes between two positions already passed over (empty if out of range).
    pub(crate) fn passed(&self, start: usize) -> &'a [u8] {
        self.bytes.get(start..self.pos).unwrap_or(&[])
    }

    pub(crate) fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    pub(crate) fn take(
        &mut self,
        n: usize,
        what: impl FnOnce() -> String,
    ) -> Result<&'a [u8], GgufError> {
        match self.pos.checked_add(n) {
            Some(end) if end <= self.bytes.len() => {
                let out = &self.bytes[self.pos..end];
                self.pos = end;
                Ok(out)
            }
            _ => Err(GgufError::Truncated {
                what: what(),
                offset: self.pos as u64,
                needed: n as u64,
                file_len: self.bytes.len() as u64,
            }),
        }
    }

    fn array<const N: usize>(
        &mut self,
        what: impl FnOnce() -> String,
    ) -> Result<[u8; N], GgufError> {
        let bytes = self.take(N, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    pub(crate) fn u32(&mut self, what: impl FnOnce() -> String) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    pub(crate) fn u64(&mut self, what: impl FnOnce() -> String) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A GGUF string: u64 byte length, then UTF-8 bytes (no terminator).
    pub(crate) fn string(&mut self, what: impl Fn() -> String) -> Result<&'a str, GgufError> {
        let len_offset = self.pos;
        let len = self.u64(|| format!("length of {}", what()))?;
        let len = usize::try_from(len).map_err(|_| GgufError::Truncated {
            what: what(),
            offset: len_offset as u64,
            needed: len,
            file_len: self.bytes.len() as u64,
        })?;
        let start = self.pos;
        let bytes = self.take(len, &what)?;
        std::str::from_utf8(bytes).map_err(|_| GgufError::InvalidUtf8 {
            what: what(),
            offset: start as u64,
        })
    }

    /// Checks that `count` items of at least `min_item_bytes` each could fit in what is left, so
    /// that a corrupt count can never make us allocate more than the file's size warrants.
    pub(crate) fn check_count(
        &self,
        count: u64,
        min_item_bytes: usize,
        what: impl FnOnce() -> String,
    ) -> Result<usize, GgufError> {
        let remaining = self.remaining() as u64;
        let fits = count
            .checked_mul(min_item_bytes as u64)
            .is_some_and(|total| total <= remaining);
        if !fits {
            return Err(GgufError::CountTooLarge {
                what: what(),
                offset: self.pos as u64,
                count,
                remaining,
            });
        }
        usize::try_from(count).map_err(|_| GgufError::overflow("an item count"))
    }
}
