//! Inputs the fuzzers found that once broke an invariant, one test each, so that the fault
//! stays fixed. Each names the target, what went wrong and the fix.
