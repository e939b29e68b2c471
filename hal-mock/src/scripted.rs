//! A rank HAL that plays a script, in the style of embedded-hal-mock: a test declares the calls
//! it expects the code under test to make, in order, and what each one answers.
//!
//! ```
//! use taskd_core::{GlobalRank, GroupInfo, HalError, HcclCode, RankHal};
//! use taskd_hal_mock::{Expect, ScriptedRankHal};
//!
//! let dp_0 = GroupInfo { name: "dp_0".into(), members: vec![GlobalRank(0), GlobalRank(8)] };
//! let network = HalError::new("HcclCommWorkingDevNicSet", HcclCode::Network, "link down");
//! let mut hal = ScriptedRankHal::new([
//!     Expect::groups(vec![dp_0.clone()]),
//!     Expect::set_working_nic("dp_0", &[1], &[true]).fails(network.clone()),
//! ]);
//! assert_eq!(hal.groups().unwrap(), vec![dp_0]);
//! let failed = hal.set_working_nic("dp_0", &[taskd_core::GroupRank(1)], &[true]);
//! assert_eq!(failed, Err(network));
//! hal.done(); // every expectation was met
//! ```
//!
//! Each call is checked against the next expectation; a call that differs (another method,
//! other arguments, or one past the end of the script) panics naming what was expected and
//! what came. The handle is a cheap clone sharing one script: the code under test owns one
//! (a worker's HAL runs on a thread of its own, where a panic would go unseen), the test keeps
//! another and calls [`ScriptedRankHal::done`], which panics with the first mismatch, if there
//! was one, or with what is left of the script. Dropping the last handle with expectations
//! left panics too, unless the thread is already panicking.

use parking_lot::Mutex;
use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use taskd_core::{GroupInfo, GroupRank, HalError, RankHal, SwitchCapabilities};

/// A call of the [`RankHal`] conversation, with its arguments.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Call {
    Groups,
    SetWorkingNic {
        group: String,
        ranks: Vec<GroupRank>,
        use_backup: Vec<bool>,
    },
    Capabilities,
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Call::Groups => f.write_str("groups()"),
            Call::SetWorkingNic {
                group,
                ranks,
                use_backup,
            } => {
                let ranks: Vec<u32> = ranks.iter().map(|r| r.0).collect();
                write!(f, "set_working_nic({group:?}, {ranks:?}, {use_backup:?})")
            }
            Call::Capabilities => f.write_str("capabilities()"),
        }
    }
}

/// What an expected call answers.
#[derive(Clone, Debug)]
enum Answer {
    Groups(Vec<GroupInfo>),
    Done,
    Capabilities(SwitchCapabilities),
    Fails(HalError),
}

/// One expected call and its answer.
#[derive(Clone, Debug)]
pub struct Expect {
    call: Call,
    answer: Answer,
}

impl Expect {
    /// `groups()`, answering `groups`.
    pub fn groups(groups: Vec<GroupInfo>) -> Self {
        Expect {
            call: Call::Groups,
            answer: Answer::Groups(groups),
        }
    }

    /// `set_working_nic(group, ranks, use_backup)` with exactly these arguments (group ranks
    /// as numbers), succeeding.
    pub fn set_working_nic(group: &str, ranks: &[u32], use_backup: &[bool]) -> Self {
        Expect {
            call: Call::SetWorkingNic {
                group: group.to_owned(),
                ranks: ranks.iter().copied().map(GroupRank).collect(),
                use_backup: use_backup.to_vec(),
            },
            answer: Answer::Done,
        }
    }

    /// `capabilities()`, answering `caps`.
    pub fn capabilities(caps: SwitchCapabilities) -> Self {
        Expect {
            call: Call::Capabilities,
            answer: Answer::Capabilities(caps),
        }
    }

    /// The same call, failing with `error`. (`capabilities()` cannot fail: asking for that
    /// panics.)
    pub fn fails(self, error: HalError) -> Self {
        assert!(
            self.call != Call::Capabilities,
            "Expect::capabilities cannot fail: RankHal::capabilities returns no Result"
        );
        Expect {
            answer: Answer::Fails(error),
            ..self
        }
    }
}

struct Script {
    expected: VecDeque<Expect>,
    /// Calls made so far.
    calls: usize,
    /// The first mismatch, reported again by `done`.
    mismatch: Option<String>,
    done: bool,
}

impl Drop for Script {
    fn drop(&mut self) {
        if self.done || std::thread::panicking() {
            return;
        }
        if let Some(problem) = self.verdict() {
            panic!("{problem}");
        }
    }
}

impl Script {
    /// What went wrong: the first mismatch, else the expectations left; `None` if nothing.
    fn verdict(&self) -> Option<String> {
        if let Some(m) = &self.mismatch {
            return Some(m.clone());
        }
        let left: Vec<String> = self.expected.iter().map(|e| e.call.to_string()).collect();
        (!left.is_empty()).then(|| {
            format!(
                "ScriptedRankHal: {} expected call(s) never came after {} call(s): {}",
                left.len(),
                self.calls,
                left.join(", ")
            )
        })
    }
}

/// A [`RankHal`] that checks every call against a script and answers from it.
#[derive(Clone)]
pub struct ScriptedRankHal {
    script: Arc<Mutex<Script>>,
}

impl ScriptedRankHal {
    /// A HAL expecting exactly `expectations`, in this order.
    pub fn new(expectations: impl IntoIterator<Item = Expect>) -> Self {
        ScriptedRankHal {
            script: Arc::new(Mutex::new(Script {
                expected: expectations.into_iter().collect(),
                calls: 0,
                mismatch: None,
                done: false,
            })),
        }
    }

    /// Asserts that the conversation went as scripted: no call differed from its expectation
    /// (on any handle, any thread) and none is left.
    pub fn done(&self) {
        let mut s = self.script.lock();
        s.done = true;
        if let Some(problem) = s.verdict() {
            drop(s);
            panic!("{problem}");
        }
    }

    /// Checks `actual` against the next expectation and returns its answer.
    fn next(&self, actual: Call) -> Answer {
        let mut s = self.script.lock();
        s.calls += 1;
        let n = s.calls;
        let problem = match s.expected.pop_front() {
            Some(e) if e.call == actual => return e.answer,
            Some(e) => format!(
                "ScriptedRankHal: call {n} was {actual}, but the script expected {}",
                e.call
            ),
            None => {
                format!("ScriptedRankHal: call {n} was {actual}, but the script has no more calls")
            }
        };
        s.mismatch.get_or_insert_with(|| problem.clone());
        drop(s);
        panic!("{problem}");
    }
}

impl RankHal for ScriptedRankHal {
    fn groups(&mut self) -> Result<Vec<GroupInfo>, HalError> {
        match self.next(Call::Groups) {
            Answer::Groups(g) => Ok(g),
            Answer::Fails(e) => Err(e),
            other => unreachable!("groups() scripted with {other:?}"),
        }
    }

    fn set_working_nic(
        &mut self,
        group: &str,
        ranks: &[GroupRank],
        use_backup: &[bool],
    ) -> Result<(), HalError> {
        let call = Call::SetWorkingNic {
            group: group.to_owned(),
            ranks: ranks.to_vec(),
            use_backup: use_backup.to_vec(),
        };
        match self.next(call) {
            Answer::Done => Ok(()),
            Answer::Fails(e) => Err(e),
            other => unreachable!("set_working_nic scripted with {other:?}"),
        }
    }

    fn capabilities(&mut self) -> SwitchCapabilities {
        match self.next(Call::Capabilities) {
            Answer::Capabilities(c) => c,
            other => unreachable!("capabilities() scripted with {other:?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::panic::{catch_unwind, AssertUnwindSafe};
    use taskd_core::{GlobalRank, HalErrorKind, HcclCode};

    fn world() -> GroupInfo {
        GroupInfo {
            name: "world".into(),
            members: vec![GlobalRank(0), GlobalRank(1)],
        }
    }

    fn panic_text(f: impl FnOnce()) -> String {
        let e = catch_unwind(AssertUnwindSafe(f)).expect_err("it should panic");
        e.downcast_ref::<String>()
            .cloned()
            .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default()
    }

    #[test]
    fn a_conversation_that_follows_the_script_gets_its_answers() {
        let timeout = HalError::new("HcclCommWorkingDevNicSet", HcclCode::Timeout, "");
        let mut hal = ScriptedRankHal::new([
            Expect::capabilities(SwitchCapabilities::ALL),
            Expect::groups(vec![world()]),
            Expect::set_working_nic("world", &[1], &[true]).fails(timeout.clone()),
            Expect::set_working_nic("world", &[0, 1], &[false, false]),
        ]);
        let watcher = hal.clone();
        assert_eq!(hal.capabilities(), SwitchCapabilities::ALL);
        assert_eq!(hal.groups(), Ok(vec![world()]));
        assert_eq!(
            hal.set_working_nic("world", &[GroupRank(1)], &[true]),
            Err(timeout)
        );
        assert_eq!(
            hal.set_working_nic("world", &[GroupRank(0), GroupRank(1)], &[false, false]),
            Ok(())
        );
        watcher.done();
    }

    #[test]
    fn a_call_with_other_arguments_names_both_and_done_repeats_it() {
        let mut hal = ScriptedRankHal::new([Expect::set_working_nic("dp_0", &[1], &[true])]);
        let watcher = hal.clone();
        let text = panic_text(|| {
            let _ = hal.set_working_nic("dp_0", &[GroupRank(1)], &[false]);
        });
        assert_eq!(
            text,
            "ScriptedRankHal: call 1 was set_working_nic(\"dp_0\", [1], [false]), but the \
             script expected set_working_nic(\"dp_0\", [1], [true])"
        );
        assert_eq!(panic_text(|| watcher.done()), text);
    }

    #[test]
    fn a_call_past_the_end_of_the_script_panics() {
        let mut hal = ScriptedRankHal::new([]);
        let text = panic_text(|| {
            let _ = hal.groups();
        });
        assert!(
            text.contains("call 1 was groups(), but the script has no more"),
            "{text}"
        );
        // Nobody called `done`: dropping the last handle reports the mismatch again.
        assert_eq!(panic_text(move || drop(hal)), text);
    }

    #[test]
    fn done_and_drop_report_what_is_left() {
        let hal = ScriptedRankHal::new([
            Expect::groups(vec![world()]),
            Expect::set_working_nic("world", &[0], &[true]).fails(crate::MOCK.uncoded(
                "nic",
                HalErrorKind::Network,
                "",
            )),
        ]);
        assert_eq!(
            panic_text(|| hal.clone().done()),
            "ScriptedRankHal: 2 expected call(s) never came after 0 call(s): groups(), \
             set_working_nic(\"world\", [0], [true])"
        );
        // `done` was called: dropping is quiet now.
        drop(hal);
        let forgotten = ScriptedRankHal::new([Expect::groups(vec![])]);
        assert!(panic_text(move || drop(forgotten)).contains("never came"));
    }

    #[test]
    fn dropping_while_panicking_does_not_panic_again() {
        // A second panic would abort the test process instead of returning here.
        let text = panic_text(|| {
            let _hal = ScriptedRankHal::new([Expect::groups(vec![])]);
            panic!("the test failed first");
        });
        assert_eq!(text, "the test failed first");
    }

    #[test]
    #[should_panic(expected = "capabilities cannot fail")]
    fn capabilities_cannot_be_scripted_to_fail() {
        let _ = Expect::capabilities(SwitchCapabilities::ALL).fails(crate::MOCK.uncoded(
            "caps",
            HalErrorKind::Other,
            "",
        ));
    }
}
