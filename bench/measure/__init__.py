"""What codecs and transports are measured against: paired ratios and direct baselines."""
