from embedserve.cli import main

raise SystemExit(main())
