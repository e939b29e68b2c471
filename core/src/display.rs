//! Text for people: how lists of ranks, nodes and devices appear in errors and reports.

use std::fmt::Display;

/// How many items a list names before it only counts the rest.
pub const SHOWN: usize = 16;

/// `a, b, c`, or the first [`SHOWN`] then `... (N in all)`: long enough to act on, short
/// enough that a job of ten thousand ranks does not flood a message.
pub fn short_list<T: Display>(items: impl IntoIterator<Item = T>) -> String {
    let mut shown = Vec::new();
    let mut total = 0usize;
    for item in items {
        if total < SHOWN {
            shown.push(item.to_string());
        }
        total += 1;
    }
    if total > SHOWN {
        format!("{}, ... ({total} in all)", shown.join(", "))
    } else {
        shown.join(", ")
    }
}

/// `rank 7 has` or `ranks 1, 3 have`: the subject of a message for a list [`short_list`]
/// wrote, with the verb that agrees with it (`one` for a single rank, `many` for more).
pub fn ranks_with(list: &str, one: &str, many: &str) -> String {
    if list.contains(',') {
        format!("ranks {list} {many}")
    } else {
        format!("rank {list} {one}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_rank_is_singular() {
        assert_eq!(ranks_with("7", "has", "have"), "rank 7 has");
        assert_eq!(ranks_with("1, 3", "has", "have"), "ranks 1, 3 have");
        let long = short_list(0..40);
        assert!(ranks_with(&long, "is", "are").ends_with("(40 in all) are"));
    }

    #[test]
    fn names_a_few_and_counts_the_rest() {
        assert_eq!(short_list(Vec::<u32>::new()), "");
        assert_eq!(short_list([1, 2, 3]), "1, 2, 3");
        assert_eq!(
            short_list(0..16),
            (0..16)
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
        assert_eq!(
            short_list(0..40),
            "0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, ... (40 in all)"
        );
    }
}
