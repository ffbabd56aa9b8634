//! Running a model through stateright's checker, and counterexamples as
//! readable traces.

use std::fmt::{self, Debug};
use std::hash::Hash;
use std::time::{Duration, Instant};

use stateright::{Checker, Expectation, HasDiscoveries, Model};

/// A model whose steps can be told in the protocol's own terms.
pub trait Narrate: Model {
    /// One line for the step `action` from `before` to `after`, such as
    /// `t=3 client B: acquire -> granted, fencing token 2`.
    fn narrate(&self, before: &Self::State, action: &Self::Action, after: &Self::State) -> String;

    /// A short summary of a state, printed after the last step of a trace.
    fn summarize(&self, state: &Self::State) -> String;
}

/// How to run a check.
#[derive(Clone, Copy, Debug)]
pub struct Run {
    /// Checker threads.
    pub threads: usize,
    /// Stop exploring below this depth (`None`: every reachable state).
    pub max_depth: Option<usize>,
    /// Stop at the first property that fails (for a check expected to fail;
    /// `sometimes` properties may then go unreached).
    pub stop_at_first_failure: bool,
}

impl Default for Run {
    fn default() -> Self {
        Self {
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            max_depth: None,
            stop_at_first_failure: false,
        }
    }
}

/// A property that failed, with the path that breaks it.
#[derive(Clone, Debug)]
pub struct Counterexample {
    /// The property's name.
    pub property: &'static str,
    /// The numbered steps, one per line, then the final state.
    pub trace: String,
    /// How many steps.
    pub steps: usize,
}

/// What one check found.
#[derive(Clone, Debug)]
pub struct Report {
    /// The model's name, for the printout.
    pub name: String,
    /// Distinct states visited.
    pub unique_states: usize,
    /// States generated (with repeats).
    pub states: usize,
    /// Longest path explored.
    pub max_depth: usize,
    /// Wall-clock time of the check.
    pub elapsed: Duration,
    /// `always` / `eventually` properties that failed.
    pub counterexamples: Vec<Counterexample>,
    /// `sometimes` properties (sanity: the model reaches the situation) that
    /// were never reached: the model is too small or broken.
    pub unreached: Vec<&'static str>,
}

impl Report {
    /// `true` when every property held and every `sometimes` was reached.
    pub fn is_clean(&self) -> bool {
        self.counterexamples.is_empty() && self.unreached.is_empty()
    }

    /// The counterexample for `property`, if it failed.
    pub fn counterexample(&self, property: &str) -> Option<&Counterexample> {
        self.counterexamples.iter().find(|c| c.property == property)
    }

    /// Panics with every counterexample's trace unless the report is clean.
    #[track_caller]
    pub fn assert_clean(&self) {
        assert!(self.is_clean(), "{self}");
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{}: {} unique states ({} generated), depth {}, {:.2?}",
            self.name, self.unique_states, self.states, self.max_depth, self.elapsed
        )?;
        for c in &self.counterexamples {
            writeln!(
                f,
                "\nCOUNTEREXAMPLE to \"{}\" ({} steps):\n{}",
                c.property, c.steps, c.trace
            )?;
        }
        for name in &self.unreached {
            writeln!(
                f,
                "\nNEVER REACHED: \"{name}\" (the model does not reach a situation it must)"
            )?;
        }
        Ok(())
    }
}

/// Checks every property of `model` over every reachable state (within
/// `run.max_depth`), breadth first, so counterexamples are short.
pub fn check<M>(name: impl Into<String>, model: M, run: Run) -> Report
where
    M: Narrate + Send + Sync + 'static,
    M::State: Debug + Hash + Send + Sync + Clone + PartialEq + 'static,
    M::Action: Debug + Clone + PartialEq,
{
    let started = Instant::now();
    let mut builder = model.checker().threads(run.threads.max(1));
    if let Some(depth) = run.max_depth {
        builder = builder.target_max_depth(depth);
    }
    if run.stop_at_first_failure {
        builder = builder.finish_when(HasDiscoveries::AnyFailures);
    }
    let checker = builder.spawn_bfs().join();
    let elapsed = started.elapsed();
    let model = checker.model();
    let mut counterexamples = Vec::new();
    let mut unreached = Vec::new();
    for property in model.properties() {
        let found = checker.discovery(property.name);
        match (&property.expectation, found) {
            (Expectation::Sometimes, None) => unreached.push(property.name),
            (Expectation::Sometimes, Some(_)) => {}
            (_, Some(path)) => {
                let steps = path.clone().into_vec();
                let mut trace = String::new();
                let mut n = 0;
                for pair in steps.windows(2) {
                    let (before, action) = &pair[0];
                    let (after, _) = &pair[1];
                    if let Some(action) = action {
                        n += 1;
                        trace.push_str(&format!(
                            "{n:>3}. {}\n",
                            model.narrate(before, action, after)
                        ));
                    }
                }
                trace.push_str(&format!(
                    "     then: {}\n",
                    model.summarize(path.last_state())
                ));
                counterexamples.push(Counterexample {
                    property: property.name,
                    trace,
                    steps: n,
                });
            }
            (_, None) => {}
        }
    }
    Report {
        name: name.into(),
        unique_states: checker.unique_state_count(),
        states: checker.state_count(),
        max_depth: checker.max_depth(),
        elapsed,
        counterexamples,
        unreached,
    }
}
