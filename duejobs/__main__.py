from duejobs.cli import main

main()
