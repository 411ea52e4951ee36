from fsdpdoctor.cli import main

raise SystemExit(main())
