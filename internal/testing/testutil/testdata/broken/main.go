package main

func main() { nothere() }
