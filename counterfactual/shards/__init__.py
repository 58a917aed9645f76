"""The shard format: what a run folder holds and how it is read and checked, apart from the job
that makes it (:mod:`counterfactual.synth`): the sample json (:mod:`.samples`), the shards and
their stats files (:mod:`.shards`), the loaders' indexes (:mod:`.indexes`), the dataset card
(:mod:`.card`), ``counterfactual check`` (:mod:`.check`), the run's file names (:mod:`.names`)
and a record's picture in the frame of its boxes (:mod:`.frames`, :mod:`.pictures`)."""
