"""qlinear"""
