//! Redis Cluster slots: which part of a name is hashed (its hash tag), the
//! slot a name hashes to, and the short tag of each slot's fencing counter.

/// `true` if Redis Cluster would hash only a part of `key`: a `{` followed later
/// by a `}` with at least one byte between them.
pub(crate) fn has_hash_tag(key: &str) -> bool {
    match key.find('{') {
        Some(open) => key[open + 1..].find('}').is_some_and(|close| close > 0),
        None => false,
    }
}

/// The Redis Cluster slot of a name: CRC16 (XMODEM) of its hash tag, mod 16384.
pub(crate) fn slot(name: &str) -> u16 {
    slot_of_bytes(name.as_bytes())
}

/// [`slot`] of a name that need not be UTF-8.
pub(crate) fn slot_of_bytes(bytes: &[u8]) -> u16 {
    let tagged = bytes.iter().position(|b| *b == b'{').and_then(|open| {
        let rest = &bytes[open + 1..];
        rest.iter()
            .position(|b| *b == b'}')
            .filter(|close| *close > 0)
            .map(|close| &rest[..close])
    });
    crc16(tagged.unwrap_or(bytes)) % 16384
}

/// CRC16 (XMODEM) of `bytes`, a byte at a time from [`CRC16_TABLE`] (the
/// bitwise loop costs eight rounds a byte, on every lock's names).
pub(super) fn crc16(bytes: &[u8]) -> u16 {
    bytes.iter().fold(0, |crc: u16, byte| {
        (crc << 8) ^ CRC16_TABLE[usize::from((crc >> 8) as u8 ^ byte)]
    })
}

/// CRC16 (XMODEM, polynomial 0x1021) of each byte value, made at compile time.
const CRC16_TABLE: [u16; 256] = {
    let mut table = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

/// For each of the 16,384 slots, the shortest base-36 string (first in
/// length-then-value order) whose CRC16 puts it in that slot.
static SLOT_TAGS: std::sync::LazyLock<Box<[[u8; 4]]>> = std::sync::LazyLock::new(|| {
    const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut tags = vec![[0u8; 4]; 16384];
    let mut found = 0;
    'lengths: for len in 1..=4u32 {
        for n in 0..36u32.pow(len) {
            let mut tag = [0u8; 4];
            let mut rest = n;
            for i in (0..len as usize).rev() {
                tag[i] = DIGITS[(rest % 36) as usize];
                rest /= 36;
            }
            let slot = usize::from(crc16(&tag[..len as usize]) % 16384);
            if tags[slot][0] == 0 {
                tags[slot] = tag;
                found += 1;
                if found == tags.len() {
                    break 'lengths;
                }
            }
        }
    }
    assert_eq!(found, tags.len(), "4 base-36 digits reach every slot");
    tags.into_boxed_slice()
});

/// The tag of `slot`'s fencing counter: at most 4 of `[0-9a-z]`, hashing
/// to `slot`.
pub(crate) fn slot_tag(slot: u16) -> &'static str {
    let tag = &SLOT_TAGS[usize::from(slot % 16384)];
    let len = tag.iter().position(|b| *b == 0).unwrap_or(tag.len());
    std::str::from_utf8(&tag[..len]).unwrap_or_default()
}

/// The fencing counter every key of `slot` shares.
pub(super) fn slot_counter(prefix: &str, slot: u16) -> String {
    // Pushed, not `format!`ed: this runs on every acquire and release.
    let tag = slot_tag(slot);
    let mut name = String::with_capacity(prefix.len() + tag.len() + 3);
    name.push_str(prefix);
    name.push_str("S{");
    name.push_str(tag);
    name.push('}');
    name
}
