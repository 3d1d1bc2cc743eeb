"""The package's commands, one module each, named as the command
(``pyproject.toml`` maps them): ``fairseq-hybrid-train`` (:mod:`.train`),
``fairseq-hybrid-average`` (:mod:`.average`), ``fairseq-hybrid-translate``
(:mod:`.translate`), ``fairseq-hybrid-plan`` (:mod:`.plan`) and its ``calibrate``
(:mod:`.calibrate`)."""
