from counterfactual.cli import main

raise SystemExit(main())
