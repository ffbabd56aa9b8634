//! Redis Cluster slots: which part of a name is hashed (its hash tag), the
//! slot a name hashes to, and the short tag of each slot's fencing counter.

/// `true` if Redis Cluster would hash only a part of `key`: a `{` followed later
/// by a `}` with at least one byte between them.
pub(crate) fn has_hash_tag(key: &str) -> bool {
    // Bytes, not chars: `{` and `}` are ASCII, and never part of another
    // UTF-8 sequence.
    let key = key.as_bytes();
    match key.iter().position(|b| *b == b'{') {
        Some(open) => key[open + 1..]
            .iter()
            .position(|b| *b == b'}')
            .is_some_and(|close| close > 0),
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
    let (text, ends) = &*SLOT_TAG_TEXT;
    let slot = usize::from(slot % 16384);
    let start = if slot == 0 {
        0
    } else {
        ends[slot - 1] as usize
    };
    text.get(start..ends[slot] as usize).unwrap_or_default()
}

/// Every slot's tag, one after the other in one string, and where each
/// ends: a tag is then a slice of text checked once, not bytes to check
/// for UTF-8 on each of the two calls of every acquire and release.
static SLOT_TAG_TEXT: std::sync::LazyLock<(String, Box<[u32]>)> = std::sync::LazyLock::new(|| {
    let mut text = String::with_capacity(4 * SLOT_TAGS.len());
    let mut ends = Vec::with_capacity(SLOT_TAGS.len());
    for tag in SLOT_TAGS.iter() {
        // Base-36 digits: ASCII, one char each.
        text.extend(tag.iter().take_while(|b| **b != 0).map(|b| char::from(*b)));
        ends.push(text.len() as u32);
    }
    (text, ends.into_boxed_slice())
});

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
