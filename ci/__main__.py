from ci.cli import main

raise SystemExit(main())
