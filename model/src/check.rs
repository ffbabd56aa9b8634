//! Running a model through stateright's checker, and counterexamples as
//! readable traces.

use std::fmt::{self, Debug};
use std::hash::Hash;
use std::time::{Duration, Instant};

use stateright::{Checker, Expectation, HasDiscoveries, Model};

/// A model whose steps can be told in the protocol's own terms.
///
/// Its steps are one function, [`Narrate::apply`], run quietly by the checker
/// (through [`next_state`]) and with a [`Log`] to print a trace.
pub trait Narrate: Model {
    /// Applies `action` to `state` in place; `log` gets what happened when
    /// narrating.
    fn apply(&self, state: &mut Self::State, action: Self::Action, log: &mut Log);

    /// The state's clock, which starts each narrated step.
    fn now(state: &Self::State) -> u8;

    /// One line for the step `action` from `before` to `after`, such as
    /// `t=3 client B: acquire -> granted, fencing token 2`.
    fn narrate(&self, before: &Self::State, action: &Self::Action, _after: &Self::State) -> String
    where
        Self::State: Clone,
        Self::Action: Clone,
    {
        let mut state = before.clone();
        let mut log = Log::narrating();
        self.apply(&mut state, action.clone(), &mut log);
        format!("t={} {}", Self::now(before), log.0.unwrap_or_default())
    }

    /// A short summary of a state, printed after the last step of a trace.
    fn summarize(&self, state: &Self::State) -> String;
}

/// [`Model::next_state`] of a [`Narrate`] model: `action` applied to a copy
/// of `last`, quietly.
pub fn next_state<M>(model: &M, last: &M::State, action: M::Action) -> Option<M::State>
where
    M: Narrate,
    M::State: Clone,
{
    let mut state = last.clone();
    model.apply(&mut state, action, &mut Log::quiet());
    Some(state)
}

/// The plumbing of a [`Narrate`] model, written at the top of its
/// `impl Model`: its `State` and `Action` types, [`Model::next_state`]
/// ([`next_state`]) and [`Model::within_boundary`] (the clock,
/// [`Narrate::now`], at most `horizon`).
macro_rules! narrated_model {
    ($state:ty, $action:ty, horizon: $horizon:expr) => {
        type State = $state;
        type Action = $action;

        fn next_state(&self, last: &Self::State, action: Self::Action) -> Option<Self::State> {
            $crate::check::next_state(self, last, action)
        }

        fn within_boundary(&self, s: &Self::State) -> bool {
            <Self as $crate::check::Narrate>::now(s) <= $horizon
        }
    };
}
pub(crate) use narrated_model;

/// [`Model::actions`]' order, shared by the models: the `urgent` actions
/// first (a step the system takes before time passes), then the `lazy` ones,
/// then `tick` when nothing is urgent and the system is `busy`.
pub fn schedule<A>(out: &mut Vec<A>, urgent: Vec<A>, lazy: Vec<A>, busy: bool, tick: A) {
    let time_passes = urgent.is_empty() && busy;
    out.extend(urgent);
    out.extend(lazy);
    if time_passes {
        out.push(tick);
    }
}

/// Where a step tells what happened: nowhere while the checker explores (no
/// string is built), a line while a trace is printed.
#[derive(Debug)]
pub struct Log(Option<String>);

impl Log {
    /// A log that keeps nothing.
    pub fn quiet() -> Self {
        Self(None)
    }

    /// A log that keeps what it is told.
    pub fn narrating() -> Self {
        Self(Some(String::new()))
    }

    /// `true` when narrating.
    pub fn on(&self) -> bool {
        self.0.is_some()
    }

    /// Adds `text` (built only when narrating), after a `; `.
    pub fn say(&mut self, text: impl FnOnce() -> String) {
        if let Some(s) = &mut self.0 {
            if !s.is_empty() {
                s.push_str("; ");
            }
            s.push_str(&text());
        }
    }
}

/// `always` properties that a ghost flag of the state stays unset (the step
/// that breaks the property sets it), one row a property:
///
/// ```text
/// never_set![RecordsModel; "a completed request never runs again" => ran_after_done]
/// ```
macro_rules! never_set {
    ($model:ty; $($name:literal => $($flag:ident).+),* $(,)?) => {
        [$(::stateright::Property::always($name, |_: &$model, s: &State| !s.$($flag).+)),*]
    };
}
pub(crate) use never_set;

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
    /// Stop once this property has a counterexample (for a check expected
    /// to break it; others may fail first without stopping it).
    pub stop_at: Option<&'static str>,
}

impl Default for Run {
    fn default() -> Self {
        Self {
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            max_depth: None,
            stop_at_first_failure: false,
            stop_at: None,
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
    if let Some(property) = run.stop_at {
        builder = builder.finish_when(HasDiscoveries::AnyOf([property].into()));
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
