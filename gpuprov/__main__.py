from gpuprov.cli.app import main

main()
