//! The urnic XDP program and loader (filled by the datapath issue).
