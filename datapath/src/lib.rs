//! The urnic polling datapath (filled by the datapath issue).
