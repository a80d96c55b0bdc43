"""The one home of slime compatibility: `stand_ins` serves slime's type modules where slime is
not installed and converts Samples at plugin boundaries; `args` builds constructor keywords from
a slime args namespace (data sources written for slime)."""
