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

#[cfg(test)]
mod tests {
    use super::*;

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
