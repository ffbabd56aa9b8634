//! A mutex's derived names as the pieces they are made of, for writing
//! them into a script command without building each as a `String` first
//! (every acquire and release names the fencing counter and the queue's
//! deadlines).

use super::{KeyNames, LockKind, Role, slot_tag};

impl KeyNames {
    /// [`fence`](Self::fence) as its pieces.
    pub(crate) fn fence_parts(&self) -> [&str; 4] {
        [&self.lock[..self.kind_at], "S{", slot_tag(self.slot), "}"]
    }

    /// [`deadlines`](Self::deadlines) as its pieces: the lock's name with
    /// its role letter replaced.
    pub(crate) fn deadlines_parts(&self) -> [&str; 3] {
        let role = match self.kind {
            _ if self.is_leader() => Role::LeaderDeadlines,
            LockKind::RwLock => Role::RwDeadlines,
            LockKind::Semaphore => Role::SemaphoreDeadlines,
            _ => Role::QueueDeadlines,
        };
        let letter = role.letter_str();
        [
            &self.lock[..self.kind_at],
            letter,
            &self.lock[self.kind_at + 1..],
        ]
    }
}

impl Role {
    /// [`letter`](Self::letter) as a string.
    fn letter_str(self) -> &'static str {
        const LETTERS: &str = "ABCDEFGHIJKLMNOPQRSTUVWXYZ";
        let at = usize::from(self.letter() as u8 - b'A');
        &LETTERS[at..=at]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::Access;

    #[test]
    fn the_pieces_make_the_names() {
        for key in ["order:1", "{tenant:7}:order:1", "}odd", "x"] {
            let rw = KeyNames::of_kind("lock:", key, LockKind::RwLock, Access::Shared(0));
            let permits = KeyNames::of_kind("lock:", key, LockKind::Semaphore, Access::Shared(2));
            let leader = KeyNames::leader("lock:", key);
            for (names, letter) in [
                (KeyNames::new("lock:", key), "D"),
                (leader, "K"),
                (rw, "F"),
                (permits, "U"),
            ] {
                assert_eq!(names.fence_parts().concat(), names.fence(), "{key}");
                // The lock's name with its letter replaced, built as a string.
                let mut deadlines = names.lock.clone();
                deadlines.replace_range(names.kind_at..=names.kind_at, letter);
                assert_eq!(names.deadlines_parts().concat(), deadlines, "{key}");
            }
        }
    }
}
