//! One member's view of a group's NIC configuration, kept sparse.
//!
//! A view says, per group rank, whether that rank uses its backup NIC. Real jobs switch a
//! handful of ranks while groups have thousands of members (the world group of a 16,384-rank
//! job), so a dense `Vec<bool>` per member would cost members x members bytes per group: 256
//! MiB for that world group alone, and as much time to compare. A view here is the sorted list
//! of the group ranks on their backup NIC: empty (no allocation) for the default, a few entries
//! after a switch.

/// The group ranks on their backup NIC, ascending, without repeats.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct BackupSet(Vec<u32>);

impl BackupSet {
    /// Whether group rank `gr` uses its backup NIC.
    pub(crate) fn contains(&self, gr: usize) -> bool {
        self.0.binary_search(&(gr as u32)).is_ok()
    }

    /// Puts group rank `gr` on its backup NIC (`use_backup`) or back on its primary.
    pub(crate) fn set(&mut self, gr: usize, use_backup: bool) {
        let gr = gr as u32;
        match (self.0.binary_search(&gr), use_backup) {
            (Err(i), true) => self.0.insert(i, gr),
            (Ok(i), false) => {
                self.0.remove(i);
            }
            _ => {}
        }
    }

    /// The group ranks on their backup NIC, ascending.
    pub(crate) fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.0.iter().map(|g| *g as usize)
    }

    /// `use_backup` per group rank of a group of `n` members.
    pub(crate) fn to_dense(&self, n: usize) -> Vec<bool> {
        let mut v = vec![false; n];
        for gr in self.iter().filter(|gr| *gr < n) {
            v[gr] = true;
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_view_keeps_only_the_ranks_on_backup_in_order() {
        let mut v = BackupSet::default();
        assert_eq!(v.iter().count(), 0);
        v.set(7, true);
        v.set(2, true);
        v.set(7, true);
        v.set(3, false);
        assert_eq!(v.iter().collect::<Vec<_>>(), [2, 7]);
        assert!(v.contains(7) && !v.contains(3));
        assert_eq!(
            v.to_dense(8),
            [false, false, true, false, false, false, false, true]
        );
        v.set(2, false);
        let mut w = BackupSet::default();
        w.set(7, true);
        assert_eq!(v, w);
    }
}
