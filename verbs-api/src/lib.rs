//! The urnic verbs API (filled by the verbs issue).
